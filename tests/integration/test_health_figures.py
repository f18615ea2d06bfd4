"""The health figures of each part (``django_outbox.health.figures``): given rows in each
condition, the figures say so, exactly while they are small, capped or estimated when
they are not; and on PostgreSQL no figure reads a table whole."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_outbox.health import counting, figures
from django_outbox.health.counting import Count
from django_outbox.inbox.models import InboxState
from django_outbox.jobs.models import JobState, Resolution
from django_outbox.outbox.models import OutboxState
from tests import health_rows as make

pytestmark = pytest.mark.django_db


@pytest.fixture
def now():
    return make.pinned_now()


def test_outbox_figures_count_each_state_what_is_due_parked_and_uncertain(now):
    # Given three due messages (the oldest due for two minutes), one due later, three
    # parked behind failed keys (two keys), two being sent, four failed (one uncertain),
    # five sent and one cancelled,
    for seconds in (120, 30, 1):
        make.outbox(now, available_at=make.ago(now, seconds))
    make.outbox(now, available_at=make.ago(now, -600))
    for key in ("order:1", "order:1", "order:2"):
        make.outbox(now, key=key, blocked=True)
    for _ in range(2):
        make.outbox(now, OutboxState.SENDING)
    for n in range(4):
        make.outbox(now, OutboxState.SEND_ERROR, uncertain=n == 0, last_error="HTTP 503")
    for _ in range(5):
        make.outbox(now, OutboxState.SENT)
    make.outbox(now, OutboxState.CANCELLED)

    # when the figures are read,
    outbox = figures.read(parts=["outbox"], now=now).parts["outbox"]

    # then each says so, exactly.
    assert outbox.states == {
        "should_be_sent": Count(7),
        "sending": Count(2),
        "sent": Count(5),
        "send_error": Count(4),
        "cancelled": Count(1),
    }
    assert outbox.due == Count(3)
    assert outbox.oldest_due_seconds == pytest.approx(120, abs=0.01)
    assert (outbox.parked, outbox.parked_keys, outbox.uncertain) == (Count(3), Count(2), Count(1))
    assert (outbox.gaps, outbox.batches_running) == (None, None)


def test_a_count_stops_at_the_cap_and_says_so(now, monkeypatch):
    monkeypatch.setattr(counting, "COUNT_CAP", 5)
    for _ in range(7):
        make.outbox(now, OutboxState.SEND_ERROR, last_error="boom")
    outbox = figures.read(parts=["outbox"], now=now).parts["outbox"]
    assert outbox.states["send_error"] == Count(5, "capped")
    assert str(outbox.states["send_error"]) == "5+"
    assert outbox.as_dict()["states"]["send_error"] == {"value": 5, "kind": "capped"}


def test_inbox_figures_count_gaps_and_the_messages_a_worker_handles(now):
    handler = make.worker(now, "inbox")
    # A message a live worker handles now (lock mode: still due, under a lease),
    make.inbox(
        now,
        available_at=make.ago(now, 5),
        locked_until=make.ago(now, -60),
        claimed_by=handler.id,
        attempted_at=make.ago(now, 2),
        attempt_open=True,
    )
    # one waiting for the sequence before it (deferred until its gap alert),
    make.inbox(
        now,
        key="order:9",
        sequence=3,
        available_at=make.ago(now, -300),
        last_error="waiting for sequence 2 of key 'order:9' (this is 3)",
    )
    make.inbox(now, InboxState.HANDLE_ERROR, last_error="ValueError: no")
    make.inbox(now, InboxState.HANDLED)
    make.inbox(now, InboxState.SKIPPED)

    health = figures.read(parts=["inbox"], now=now)
    inbox = health.parts["inbox"]

    assert inbox.states == {
        "should_be_handled": Count(2),
        "handled": Count(1),
        "handle_error": Count(1),
        "skipped": Count(1),
    }
    assert (inbox.due, inbox.gaps, inbox.held, inbox.stuck) == (Count(1), Count(1), Count(1), 0)
    assert inbox.parked is None and inbox.uncertain is None
    assert inbox.live_workers == 1
    (seen,) = health.workers
    assert (seen.id, seen.status, seen.role) == (handler.id, "alive", "inbox")
    (held,) = seen.holds
    assert (held.part, held.rows, held.started, held.stuck) == ("inbox", 1, 1, 0)


def test_jobs_figures_count_parked_jobs_batches_and_leave_resolved_failures_out(now):
    make.job(now, available_at=make.ago(now, 10))
    make.job(now, serial_key="invoice:1", sequence=2, blocked=True)
    make.job(now, serial_key="invoice:2", sequence=2, blocked=True)
    make.job(now, JobState.SUCCESSFUL)
    make.failed_job(now, "builtins.ValueError")
    make.failed_job(now, "builtins.ValueError", resolution=Resolution.CANCELLED)
    make.open_batch(now)

    health = figures.read(parts=["jobs"], now=now)
    jobs = health.parts["jobs"]

    assert jobs.states == {
        "READY": Count(3),
        "RUNNING": Count(0),
        "SUCCESSFUL": Count(1),
        "FAILED": Count(2),
    }
    assert (jobs.due, jobs.parked, jobs.parked_keys) == (Count(1), Count(2), Count(2))
    assert jobs.batches_running == Count(1)
    assert jobs.oldest_due_seconds == pytest.approx(10, abs=0.01)
    # The failure groups are of the jobs that wait for an operator (not a cancelled one).
    assert jobs.failures is not None
    assert [(g.kind, g.count) for g in jobs.failures.groups] == [("builtins.ValueError", 1)]


def test_workers_alive_dead_gone_and_without_heartbeat_with_what_each_holds(now):
    from django_outbox.conf import get_settings

    timeout = get_settings().worker_timeout_seconds
    live = make.worker(now, "jobs default,emails")
    dead = make.worker(now, "outbox", silent=timeout + 30)
    celery = make.worker(now, "celery")
    gone = uuid.uuid4()
    make.job(now, JobState.RUNNING, claimed_by=live.id, last_attempted_at=make.ago(now, 4))
    make.outbox(
        now,
        OutboxState.SENDING,
        claimed_by=dead.id,
        attempt_open=True,
        attempted_at=make.ago(now, 40),
    )
    make.outbox(now, OutboxState.SENDING, claimed_by=dead.id)
    make.outbox(now, OutboxState.SENDING, claimed_by=gone)
    make.outbox(now, OutboxState.SENDING, claimed_by=None, locked_until=make.ago(now, 5))

    health = figures.read(now=now)
    by_status = {w.status: w for w in health.workers if w.id != celery.id}

    assert by_status["alive"].role == "jobs"
    assert by_status["alive"].queues == ("default", "emails")
    assert [(h.part, h.rows, h.stuck) for h in by_status["alive"].holds] == [("jobs", 1, 0)]
    assert by_status["dead"].id == dead.id
    assert by_status["dead"].silent_seconds == pytest.approx(timeout + 30, abs=0.01)
    (held,) = by_status["dead"].holds
    assert (held.part, held.rows, held.started, held.stuck) == ("outbox", 2, 1, 2)
    assert held.since == make.ago(now, 40)
    assert "has not beaten" in held.why_stuck
    assert by_status["gone"].id == gone and by_status["gone"].holds[0].stuck == 1
    assert by_status["no heartbeat"].id is None
    assert "lease ran out" in by_status["no heartbeat"].holds[0].why_stuck
    parts = health.parts
    # A Celery worker process takes every part's rows.
    assert (parts["outbox"].live_workers, parts["jobs"].live_workers) == (1, 2)
    assert (parts["outbox"].held, parts["outbox"].stuck) == (Count(4), 4)


def test_outcomes_per_minute_come_from_the_minute_counts(now, settings):
    settings.DJANGO_OUTBOX = {**settings.DJANGO_OUTBOX, "HEALTH": {"DEAD_LETTERED_MINUTES": 15}}
    make.counted(now, "outbox", "done", 40)
    make.counted(now, "outbox", "retried", 2)
    make.counted(now, "outbox", "dead", 3)
    make.counted(now, "outbox", "held", 1, minutes_ago=5)
    make.counted(now, "outbox", "dead", 7, minutes_ago=30)
    make.counted(now, "outbox", "done", 9, minutes_ago=59)
    make.counted(now, "outbox", "done", 1000, minutes_ago=61)  # older than the chart
    make.counted(now, "jobs", "done", 5)

    outbox = figures.read(parts=["outbox"], now=now).parts["outbox"]

    throughput, failures = outbox.throughput(), outbox.failure_rate()
    assert len(throughput) == len(failures) == 60
    assert (throughput[-1], throughput[0], sum(throughput)) == (40, 9, 49)
    assert (failures[-1], failures[-6], failures[-31], sum(failures)) == (5, 1, 7, 13)
    # Dead-lettered or held in the last 15 minutes: 3 + 1 (the 7 are older).
    assert outbox.dead_lettered_recent == 4


def test_a_sweep_is_late_only_while_rows_wait(now, settings):
    make.swept(now, "outbox", 120)
    make.swept(now, "jobs", 120)
    make.swept(now, "inbox", 2)
    make.outbox(now)
    make.inbox(now)

    parts = figures.read(now=now).parts

    assert parts["outbox"].sweep.late  # rows wait, and its sweep ran 120 s ago
    assert parts["outbox"].sweep.silent_seconds == pytest.approx(120, abs=0.01)
    assert not parts["inbox"].sweep.late  # swept 2 s ago
    assert not parts["jobs"].sweep.late  # nothing waits


def test_an_unknown_part_is_refused():
    with pytest.raises(ValueError, match="unknown part"):
        figures.read(parts=["outbx"])


@pytest.mark.postgres
@pytest.mark.plans
def test_on_postgresql_no_figure_reads_a_whole_table(now, monkeypatch):
    """Given 20,000 finished rows in each table and a few in every other state, each
    statement that reads the figures goes through an index (the finished states of a
    large table come from the planner's estimate: nothing is read for them)."""
    from django_outbox.inbox.models import InboxMessage
    from django_outbox.jobs.models import Job
    from django_outbox.outbox.models import OutboxMessage

    monkeypatch.setattr(figures, "LARGE_TABLE_ROWS", 10_000)
    dead = make.worker(now, "outbox", silent=60)
    OutboxMessage.objects.bulk_create(
        OutboxMessage(
            type="t", destination="d", payload={}, state="sent", sent_at=now, finished_at=now
        )
        for _ in range(20_000)
    )
    InboxMessage.objects.bulk_create(
        InboxMessage(source="s", message_id=str(n), type="t", state="handled", finished_at=now)
        for n in range(20_000)
    )
    Job.objects.bulk_create(
        Job(task_path="t", state="SUCCESSFUL", finished_at=now) for _ in range(20_000)
    )
    make.outbox(now, key="k", blocked=True)
    make.outbox(now, OutboxState.SENDING, claimed_by=dead.id)
    make.outbox(now, OutboxState.SEND_ERROR, uncertain=True, last_error="x")
    make.inbox(now, key="k", sequence=2, available_at=make.ago(now, -60), last_error="waiting")
    make.inbox(now, InboxState.HANDLE_ERROR, last_error="x")
    make.job(now, JobState.RUNNING, claimed_by=dead.id)
    make.job(now, serial_key="s", sequence=2, blocked=True)
    make.failed_job(now, "builtins.KeyError")
    with connection.cursor() as cursor:
        for table in ("django_outbox_message", "django_outbox_inbox", "django_outbox_job"):
            cursor.execute(f"ANALYZE {table}")

    with CaptureQueriesContext(connection) as captured:
        health = figures.read(now=now)

    assert health.parts["outbox"].states["sent"].kind == "estimate"
    assert health.parts["outbox"].states["send_error"] == Count(1)
    tables = ('"django_outbox_message"', '"django_outbox_inbox"', '"django_outbox_job"')
    statements = [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].lstrip().startswith("SELECT") and any(t in q["sql"] for t in tables)
    ]
    assert len(statements) >= 20, statements
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute("EXPLAIN " + sql)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            for table in tables:
                assert f"Seq Scan on {table.strip(chr(34))}" not in plan, f"{sql}\n{plan}"
