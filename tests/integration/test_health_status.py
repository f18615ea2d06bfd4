"""The health checks (``health.status``) in each condition, and the failure groups
(``health.failures``): how failed rows are grouped, and a group action that moves only
its own rows."""

from __future__ import annotations

import pytest

from django_outbox.engine.operator import Verb
from django_outbox.health import failures, figures, status
from django_outbox.inbox.handling import Handling
from django_outbox.inbox.models import InboxState
from django_outbox.jobs.models import Job, JobState
from django_outbox.jobs.running import Running
from django_outbox.outbox.models import OutboxMessage, OutboxState
from django_outbox.outbox.relay import Publishing
from tests import health_rows as make

pytestmark = pytest.mark.django_db


@pytest.fixture
def now():
    return make.pinned_now()


@pytest.fixture
def health_settings(settings):
    """``HEALTH`` thresholds for the tests (every sweep fresh unless a test says not)."""

    def apply(**values):
        settings.DJANGO_OUTBOX = {**settings.DJANGO_OUTBOX, "HEALTH": values}

    apply()
    return apply


def checks(now, part="outbox"):
    report = status.evaluate(figures.read(parts=[part], now=now, failures=False))
    return report, {check.name: check for check in report.checks}


def swept_all(now):
    for part in figures.PARTS:
        make.swept(now, part, 1)


def test_all_is_well(now, health_settings):
    swept_all(now)
    make.worker(now, "outbox")
    make.outbox(now, available_at=make.ago(now, 2))
    report, found = checks(now)
    assert report.status == status.OK
    assert (report.http_status, report.exit_code) == (200, 0)
    assert {check.status for check in found.values()} == {status.OK}
    assert report.summary() == "OK: outbox healthy"


@pytest.mark.parametrize(
    ("waited", "expected"),
    [(59, status.OK), (61, status.WARNING), (601, status.CRITICAL)],
)
def test_the_oldest_due_row_warns_then_goes_critical(now, health_settings, waited, expected):
    health_settings(OLDEST_DUE_WARNING_SECONDS=60, OLDEST_DUE_CRITICAL_SECONDS=600)
    swept_all(now)
    make.worker(now, "outbox")
    make.outbox(now, available_at=make.ago(now, waited))
    report, found = checks(now)
    assert found["oldest_due"].status == expected
    assert found["oldest_due"].value == pytest.approx(waited, abs=0.01)
    assert report.status == expected
    assert report.http_status == (503 if expected == status.CRITICAL else 200)
    assert report.exit_code == {"ok": 0, "warning": 1, "critical": 2}[expected]


@pytest.mark.parametrize(
    ("dead", "expected"), [(0, status.OK), (2, status.WARNING), (10, status.CRITICAL)]
)
def test_new_dead_letters_warn_then_go_critical(now, health_settings, dead, expected):
    health_settings(DEAD_LETTERED_MINUTES=10, DEAD_LETTERED_WARNING=2, DEAD_LETTERED_CRITICAL=10)
    swept_all(now)
    if dead:
        make.counted(now, "jobs", "dead", dead - 1, minutes_ago=9)
        make.counted(now, "jobs", "dead", 1)
    make.counted(now, "jobs", "dead", 50, minutes_ago=10)  # before the window
    _, found = checks(now, "jobs")
    assert found["dead_lettered"].status == expected
    assert found["dead_lettered"].value == dead


def test_rows_due_with_no_live_worker_warn_then_go_critical(now, health_settings):
    health_settings(NO_WORKER_SECONDS=30)
    swept_all(now)
    make.worker(now, "inbox")  # takes no outbox rows
    make.outbox(now, available_at=make.ago(now, 10))
    _, found = checks(now)
    assert found["workers"].status == status.WARNING
    assert "critical after 30 s" in found["workers"].message
    make.outbox(now, available_at=make.ago(now, 31))
    _, found = checks(now)
    assert found["workers"].status == status.CRITICAL
    assert "no live worker takes outbox rows" in found["workers"].message


def test_a_celery_worker_takes_every_part(now, health_settings):
    health_settings(NO_WORKER_SECONDS=0)
    swept_all(now)
    make.worker(now, "celery")
    make.job(now, available_at=make.ago(now, 5))
    _, found = checks(now, "jobs")
    assert found["workers"].status == status.OK


def test_rows_of_a_dead_worker_warn_and_go_critical_when_no_one_can_rescue_them(
    now, health_settings
):
    swept_all(now)
    dead = make.worker(now, "jobs", silent=60)
    make.job(now, JobState.RUNNING, claimed_by=dead.id)
    report, found = checks(now, "jobs")
    assert found["workers"].status == status.CRITICAL
    assert "1 row(s) of dead workers wait for a rescue" in found["workers"].message
    assert report.http_status == 503
    # A live worker will rescue them within seconds: a warning meanwhile.
    make.worker(now, "jobs")
    _, found = checks(now, "jobs")
    assert found["workers"].status == status.WARNING


def test_a_late_sweep_warns_then_goes_critical(now, health_settings):
    health_settings(SWEEP_LATE_CRITICAL_SECONDS=600)
    make.worker(now, "outbox")
    make.outbox(now, available_at=make.ago(now, 1))
    make.swept(now, "outbox", 59)
    assert checks(now)[1]["sweep"].status == status.OK
    make.swept(now, "outbox", 61)
    assert checks(now)[1]["sweep"].status == status.WARNING
    make.swept(now, "outbox", 601)
    report, found = checks(now)
    assert found["sweep"].status == status.CRITICAL
    assert report.summary().startswith("CRITICAL: outbox: rows wait and the last sweep ran")


def test_the_report_as_json_has_every_check_and_the_figures(now, health_settings):
    swept_all(now)
    make.outbox(now, OutboxState.SEND_ERROR, last_error="x")
    body = status.evaluate(figures.read(now=now)).as_dict()
    assert body["status"] == status.OK
    assert {(c["part"], c["check"]) for c in body["checks"]} == {
        (part, name)
        for part in ("outbox", "inbox", "jobs")
        for name in ("oldest_due", "dead_lettered", "workers", "sweep")
    }
    assert body["parts"]["outbox"]["states"]["send_error"] == {"value": 1, "kind": "exact"}
    assert body["parts"]["outbox"]["failures"]["groups"][0]["count"] == 1


# -- failure groups --------------------------------------------------------------------


def test_failed_rows_are_grouped_by_kind_of_error_and_destination(now):
    for n in range(3):
        make.outbox(
            now,
            OutboxState.SEND_ERROR,
            destination="billing",
            last_error=f"order {1000 + n} not found",
            attempted_at=make.ago(now, 60 - n),
        )
    make.outbox(
        now, OutboxState.SEND_ERROR, destination="search", last_error="order 5555 not found"
    )
    make.outbox(now, OutboxState.SEND_ERROR, destination="billing", last_error="HTTP 503")
    found = failures.read(Publishing())
    assert (found.examined, found.capped) == (5, False)
    top = found.groups[0]
    assert (top.kind, top.target, top.count) == ("order … not found", "billing", 3)
    assert (top.first_seen, top.last_seen) == (make.ago(now, 60), make.ago(now, 58))
    assert top.example == "order 1002 not found"  # the newest
    assert sorted((g.kind, g.target, g.count) for g in found.groups[1:]) == [
        ("HTTP 503", "billing", 1),
        ("order … not found", "search", 1),
    ]


def test_the_groups_are_of_the_newest_failed_rows_when_there_are_many(now):
    for n in range(5):
        make.inbox(now, InboxState.HANDLE_ERROR, last_error=f"ValueError: {n}")
    found = failures.read(Handling(), sample=3)
    assert (found.examined, found.capped) == (3, True)
    assert [(g.kind, g.count) for g in found.groups] == [("ValueError", 3)]


def test_a_job_s_kind_is_its_last_exception_class_path(now):
    make.failed_job(now, "django_outbox.jobs.WorkerLost", last_error="its worker stopped")
    make.failed_job(now, "app.errors.Timeout", last_error="Timeout: slow")
    found = failures.read(Running())
    assert sorted(g.kind for g in found.groups) == [
        "app.errors.Timeout",
        "django_outbox.jobs.WorkerLost",
    ]


def test_a_group_action_moves_only_the_rows_of_its_group(now, monkeypatch):
    # Given a group of five failed messages, read and moved two per transaction,
    monkeypatch.setattr("django_outbox.engine.operator.CHUNK", 2)
    group = [
        make.outbox(now, OutboxState.SEND_ERROR, destination="billing", last_error="HTTP 503")
        for _ in range(5)
    ]
    other_kind = make.outbox(
        now, OutboxState.SEND_ERROR, destination="billing", last_error="HTTP 400"
    )
    elsewhere = make.outbox(
        now, OutboxState.SEND_ERROR, destination="search", last_error="HTTP 503"
    )
    # when the group is requeued,
    done = failures.act(Publishing(), Verb.REQUEUE, "HTTP 503", "billing")
    # then its five messages wait to be sent again, and nothing else moved.
    assert (done.matched, done.moved, done.more) == (5, 5, False)
    states = dict(OutboxMessage.objects.values_list("pk", "state"))
    assert {states[m.pk] for m in group} == {OutboxState.SHOULD_BE_SENT}
    assert states[other_kind.pk] == states[elsewhere.pk] == OutboxState.SEND_ERROR


def test_a_group_action_stops_at_its_limit_and_says_more_are_left(now):
    for _ in range(4):
        make.inbox(now, InboxState.HANDLE_ERROR, last_error="KeyError: 'x'")
    done = failures.act(Handling(), Verb.SKIP, "KeyError", "shop", limit=3)
    assert (done.matched, done.moved, done.more) == (3, 3, True)
    done = failures.act(Handling(), Verb.SKIP, "KeyError", "shop", limit=3)
    assert (done.matched, done.moved, done.more) == (1, 1, False)


def test_the_verbs_of_each_part_s_failed_rows():
    assert failures.verbs(Publishing()) == [Verb.REQUEUE, Verb.CANCEL]
    assert failures.verbs(Handling()) == [Verb.REQUEUE, Verb.SKIP]
    assert failures.verbs(Running()) == [Verb.REQUEUE, Verb.SKIP]


def test_retrying_a_job_group_runs_its_jobs_again(now):
    for _ in range(2):
        make.failed_job(now, "builtins.ValueError")
    done = failures.act(Running(), Verb.REQUEUE, "builtins.ValueError", "no.such.task")
    assert done.matched == 0  # another task path: nothing moved
    path = Job.objects.values_list("task_path", flat=True).first()
    done = failures.act(Running(), Verb.REQUEUE, "builtins.ValueError", path)
    assert (done.matched, done.moved) == (2, 2)
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.READY}
