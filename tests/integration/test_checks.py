"""System checks report wrong settings at startup."""

import sys

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_outbox.checks import check_settings


def ids(configure_outbox, **overrides):
    configure_outbox(**overrides)
    return sorted(message.id for message in check_settings())


def test_valid_configuration_has_no_problems(configure_outbox):
    assert ids(configure_outbox) == []


@pytest.mark.parametrize(
    ("destination", "expected"),
    [
        ({"TRANSPORT": "carrier-pigeon"}, "django_outbox.E002"),
        ({"TRANSPORT": "kombu"}, "django_outbox.E010"),
        ({"TRANSPORT": "kombu", "URL": "localhost"}, "django_outbox.E011"),
        ({"TRANSPORT": "kombu", "URL": "amqp://x", "CONFIRM": False}, "django_outbox.W011"),
        (
            {"TRANSPORT": "kombu", "URL": "redis://x", "EXCHANGE": "e", "QUEUE": "q"},
            "django_outbox.E012",
        ),
        ({"TRANSPORT": "kombu", "URL": "redis://x"}, "django_outbox.E013"),
        ({"TRANSPORT": "http", "URL": "ftp://x", "SECRET": "s"}, "django_outbox.E014"),
        ({"TRANSPORT": "http", "URL": "https://x"}, "django_outbox.W014"),
        (
            {"TRANSPORT": "http", "URL": "https://x", "SECRET": "s", "BATCH": 0},
            "django_outbox.E017",
        ),
        (
            {"TRANSPORT": "http", "URL": "https://x", "SECRET": "s", "BATCH_BYTES": "1MB"},
            "django_outbox.E017",
        ),
        ({"TRANSPORT": "celery"}, "django_outbox.E010"),
        ({"TRANSPORT": "django_outbox.conf.Destination"}, "django_outbox.E002"),
    ],
)
def test_bad_destination_is_reported(configure_outbox, destination, expected):
    assert expected in ids(configure_outbox, DESTINATIONS={"default": destination})


def test_malformed_setting_is_an_error(configure_outbox):
    assert ids(configure_outbox, BATCH_SIZE=-1) == ["django_outbox.E001"]


def test_manage_check_fails_on_errors(configure_outbox):
    configure_outbox(DESTINATIONS={"default": {"TRANSPORT": "kombu"}})
    with pytest.raises(SystemCheckError, match="URL is required"):
        call_command("check")


def test_sqlite_without_immediate_transactions_is_warned(configure_outbox, settings):
    from django.db import connections

    if connections["default"].vendor != "sqlite":
        pytest.skip("the warning concerns SQLite databases")
    options = connections["default"].settings_dict["OPTIONS"]
    saved = options.pop("transaction_mode")
    try:
        assert "django_outbox.W003" in ids(configure_outbox)
    finally:
        options["transaction_mode"] = saved
    assert "django_outbox.W003" not in ids(configure_outbox)


@pytest.mark.parametrize(
    ("destination", "expected"),
    [
        (
            {"TRANSPORT": "kombu", "URL": "amqp://x", "QUEUE": "q", "ROUTING_KEY": "orders.{type}"},
            "django_outbox.E015",
        ),
        (
            {"TRANSPORT": "http", "URL": "https://x", "SECRET": "s", "TIMEOUT": 30},
            "django_outbox.W015",
        ),
        (
            {"TRANSPORT": "kombu", "URL": "amqp://x", "QUEUE": "q", "TIMEOUT": 15},
            "django_outbox.W015",
        ),
    ],
)
def test_routing_and_lease_pitfalls_are_reported(configure_outbox, destination, expected):
    assert expected in ids(configure_outbox, DESTINATIONS={"default": destination})


def test_fixed_binding_key_or_a_plain_routing_key_pass(configure_outbox):
    for destination in (
        {
            "TRANSPORT": "kombu",
            "URL": "amqp://x",
            "QUEUE": "q",
            "ROUTING_KEY": "orders.{type}",
            "EXCHANGE": "events",
            "EXCHANGE_TYPE": "topic",
            "BINDING_KEY": "orders.#",
        },
        {"TRANSPORT": "kombu", "URL": "amqp://x", "QUEUE": "q", "ROUTING_KEY": "orders"},
    ):
        assert ids(configure_outbox, DESTINATIONS={"default": destination}) == []


def test_the_unrelated_django_outbox_distribution_is_reported(monkeypatch):
    import importlib.metadata

    class Foreign:
        version = "0.6.0"

    real = importlib.metadata.distribution

    def distribution(name):
        return Foreign() if name == "django-outbox" else real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    errors = [m for m in check_settings() if m.id == "django_outbox.E004"]
    assert len(errors) == 1 and "0.6.0" in errors[0].msg


def test_our_own_distribution_is_not_mistaken_for_the_unrelated_one() -> None:
    import importlib.metadata

    assert importlib.metadata.distribution("django-outbox-inbox").metadata["Name"] == (
        "django-outbox-inbox"
    )
    assert not [m for m in check_settings() if m.id == "django_outbox.E004"]


def test_a_misspelt_transport_alias_suggests_the_closest(configure_outbox):
    configure_outbox(DESTINATIONS={"default": {"TRANSPORT": "kombuu", "URL": "redis://x"}})
    [error] = [m for m in check_settings() if m.id == "django_outbox.E002"]
    assert "unknown transport 'kombuu' (did you mean 'kombu'?)" in error.msg


def test_a_misspelt_destination_option_is_reported_with_the_closest(configure_outbox):
    configure_outbox(
        DESTINATIONS={
            "default": {"TRANSPORT": "kombu", "URL": "redis://x", "QUEUE": "q", "CONFRIM": True},
            "hooks": {"TRANSPORT": "http", "URL": "https://x", "SECRET": "s", "TIMEOUTT": 3},
        }
    )
    warnings = sorted(m.msg for m in check_settings() if m.id == "django_outbox.W017")
    assert len(warnings) == 2
    assert "no option CONFRIM (did you mean 'CONFIRM'?)" in warnings[0]
    assert "no option TIMEOUTT (did you mean 'TIMEOUT'?)" in warnings[1]


def test_a_webhook_source_accepting_v1_signatures_is_warned(configure_outbox):
    webhook = {"TRANSPORT": "webhook", "SECRET": "s"}
    assert ids(configure_outbox, INBOX={"SOURCES": {"partner": webhook}}) == []
    configure_outbox(INBOX={"SOURCES": {"partner": {**webhook, "ACCEPT_V1": True}}})
    [warning] = check_settings()
    assert warning.id == "django_outbox.W020"
    assert "'partner' accepts v1 webhook signatures" in warning.msg
    assert "remove ACCEPT_V1" in warning.hint


# -- Celery, the Tasks API and our jobs backend --------------------------------------


def test_no_celery_app_is_a_warning_that_does_not_stop_migrate(configure_outbox, monkeypatch):
    """A project that added the app but has no Celery app yet (the quickstart's step 4)
    is warned, and `migrate`/`check` still run: nothing is lost while no worker runs."""
    from django_outbox.engine import triggers

    configure_outbox(DISPATCH="celery")
    monkeypatch.setattr(triggers, "celery_app_missing", lambda app: True)

    [warning] = [m for m in check_settings() if m.id == "django_outbox.W004"]

    assert warning.level == checks.WARNING
    assert "set DISPATCH to 'notify' (PostgreSQL) or 'none'" in warning.hint
    call_command("check")  # raises SystemCheckError on errors only
    assert "django_outbox.W004" not in ids(configure_outbox, DISPATCH="none")


def test_our_backend_without_a_tasks_api_is_an_error_naming_the_extra(settings, monkeypatch):
    """Django 5.2 without the django-tasks backport: jobs could be neither enqueued nor
    run, and nothing else would say so before the first enqueue."""
    settings.TASKS = {"default": {"BACKEND": "django_outbox.jobs.JobsBackend"}}
    with monkeypatch.context() as patch:  # neither django.tasks nor the backport imports
        patch.setitem(sys.modules, "django.tasks", None)
        patch.setitem(sys.modules, "django_tasks", None)
        problems = check_settings()

    [error] = [m for m in problems if m.id == "django_outbox.E006"]
    assert "there is no Tasks API here" in error.msg
    assert "pip install 'django-outbox-inbox[jobs]'" in error.hint
    assert not [m for m in problems if m.id == "django_outbox.E007"]


@pytest.mark.parametrize(
    "path",
    [
        "django_outbox.jobs.JobBackend",
        "django_outbox.JobsBackend",
        "django-outbox.jobs.JobsBackend",
        "django_outbox.jobs.backend.JobTask",
    ],
)
def test_a_misspelt_backend_path_is_an_error(settings, path):
    settings.TASKS = {
        "default": {"BACKEND": "django_outbox.jobs.JobsBackend"},
        "jobs": {"BACKEND": path},
    }

    [error] = [m for m in check_settings() if m.id == "django_outbox.E007"]

    assert f"TASKS['jobs']['BACKEND'] is {path!r}" in error.msg
    assert error.hint == "Set it to 'django_outbox.jobs.JobsBackend'."


def test_both_spellings_of_our_backend_and_other_libraries_backends_pass(settings):
    from django_outbox.jobs import compat

    settings.TASKS = {
        "default": {"BACKEND": "django_outbox.jobs.JobsBackend"},
        "module": {"BACKEND": "django_outbox.jobs.backend.JobsBackend"},
        "immediate": {"BACKEND": f"{compat.SOURCE}.backends.immediate.ImmediateBackend"},
    }
    assert not [m for m in check_settings() if m.id in ("django_outbox.E006", "django_outbox.E007")]


@pytest.mark.jobs
@pytest.mark.django_db(transaction=True)
def test_a_task_declared_through_another_backend_fails_saying_why(settings, tmp_path, monkeypatch):
    """A worker whose TASKS does not name our backend (or whose @task comes from another
    Tasks API) cannot import a task declared with max_attempts: the job's error says so
    instead of a bare TypeError."""
    from django_outbox.jobs import compat
    from django_outbox.jobs.backend import TasksApiMismatch, load_task
    from django_outbox.jobs.models import Job, JobState
    from django_outbox.jobs.running import Jobs

    (tmp_path / "receipts_h3.py").write_text(
        "from django_outbox.jobs.compat import task\n\n\n"
        "@task(max_attempts=2)\n"
        "def send_receipt(order_id):\n"
        "    return order_id\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from receipts_h3 import send_receipt  # declared where TASKS names our backend

    result = send_receipt.enqueue(7)
    monkeypatch.delitem(sys.modules, "receipts_h3")
    settings.TASKS = {
        "default": {"BACKEND": f"{compat.SOURCE}.backends.immediate.ImmediateBackend"}
    }

    with pytest.raises(TasksApiMismatch, match="'max_attempts' is an option of django-outbox"):
        load_task("receipts_h3.send_receipt")
    monkeypatch.delitem(sys.modules, "receipts_h3", raising=False)
    Jobs().drain()

    job = Job.objects.get(result_id=result.id)
    assert job.state == JobState.FAILED
    assert job.last_error.startswith("TasksApiMismatch: receipts_h3.send_receipt cannot be loaded")
    assert "ImmediateBackend" in job.last_error
    assert "restart workers started before the django-tasks backport" in job.last_error


# -- inbox sources and outbox destinations name each other ---------------------------


@pytest.mark.parametrize(
    ("destinations", "sources", "expected"),
    [
        # A local destination into an undeclared source: works, but say where to declare it.
        ({"self": {"TRANSPORT": "local", "SOURCE": "self"}}, {}, ["django_outbox.W006"]),
        ({"self": {"TRANSPORT": "local"}}, {}, ["django_outbox.W006"]),  # SOURCE "local"
        (
            {"self": {"TRANSPORT": "local", "SOURCE": "self"}},
            {"self": {"TRANSPORT": "local"}},
            [],
        ),
        # ... into another producer's source: ids and cursors would mix.
        (
            {"self": {"TRANSPORT": "local", "SOURCE": "orders"}},
            {"orders": {"TRANSPORT": "kombu", "URL": "amqp://x", "QUEUE": "q"}},
            ["django_outbox.E008"],
        ),
        # A local source nothing delivers into.
        ({}, {"self": {"TRANSPORT": "local"}}, ["django_outbox.W007"]),
        (
            {"self": {"TRANSPORT": "local", "SOURCE": "slef"}},
            {"self": {"TRANSPORT": "local"}},
            ["django_outbox.W006", "django_outbox.W007"],
        ),
        # Replies to a destination that does not exist.
        (
            {},
            {"partner": {"TRANSPORT": "webhook", "SECRET": "s", "REPLY_TO": "partnr"}},
            ["django_outbox.E009"],
        ),
        (
            {"partner": {"TRANSPORT": "memory"}},
            {"partner": {"TRANSPORT": "webhook", "SECRET": "s", "REPLY_TO": "partner"}},
            [],
        ),
    ],
)
def test_sources_and_destinations_are_cross_checked(
    configure_outbox, destinations, sources, expected
):
    found = ids(
        configure_outbox,
        DESTINATIONS={"default": {"TRANSPORT": "memory"}, **destinations},
        INBOX={"SOURCES": sources},
    )
    assert found == expected


def test_cross_check_messages_name_the_fix(configure_outbox):
    configure_outbox(
        DESTINATIONS={"self": {"TRANSPORT": "local", "SOURCE": "self"}},
        INBOX={"SOURCES": {"partner": {"TRANSPORT": "celery", "REPLY_TO": "partnr"}}},
    )
    messages = {m.id: m for m in check_settings()}
    assert messages["django_outbox.W006"].hint == (
        "Add 'self': {'TRANSPORT': 'local'} to DJANGO_OUTBOX['INBOX']['SOURCES']."
    )
    assert "'partnr', which is not an outbox destination" in messages["django_outbox.E009"].msg
    assert "(self)" in messages["django_outbox.E009"].hint
