"""System checks report wrong settings at startup."""

import pytest
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
