"""Hot queries use the partial indexes, so their cost follows the backlog, not history."""

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_outbox.models import OutboxMessage, OutboxState
from django_outbox.outbox.relay import Relay

pytestmark = [pytest.mark.django_db, pytest.mark.postgres, pytest.mark.plans]


@pytest.fixture
def history():
    now = timezone.now()
    OutboxMessage.objects.bulk_create(
        OutboxMessage(
            type="t",
            destination="default",
            payload={},
            state=OutboxState.SENT,
            sent_at=now,
            finished_at=now,
        )
        for _ in range(20_000)
    )
    OutboxMessage.objects.bulk_create(
        OutboxMessage(type="t", destination="default", payload={}) for _ in range(20)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_outbox_message")


def plan(queryset):
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_the_due_scan_reads_the_partial_index_not_the_history(history):
    claimable = Relay().claimable(timezone.now()).values("pk")[:500]
    text = plan(claimable)
    assert "outbox_msg_due_idx" in text, text
    assert "Seq Scan" not in text, text


def test_the_purge_and_rescue_scans_read_their_partial_indexes(history):
    """The statements the purge and the lease rescue run (``engine.sweeps``) over the
    outbox each read a partial index, never the history."""
    from django.test.utils import CaptureQueriesContext

    from django_outbox.engine import sweeps
    from django_outbox.outbox.relay import Publishing

    part = Publishing()
    with CaptureQueriesContext(connection) as captured:
        # The retained history is younger than the cut-off: nothing is deleted.
        sweeps.purge_finished(part, older_than=timedelta(days=7))
        sweeps.rescue_stuck(part, dead_workers=[uuid.uuid4()])
    statements = [
        q["sql"]
        for q in captured.captured_queries
        if 'FROM "django_outbox_message"' in q["sql"] and q["sql"].lstrip().startswith("SELECT")
    ]
    assert len(statements) >= 2, statements
    # Any partial index over "sending" rows bounds the rescue by what is in flight.
    partial = (
        "outbox_msg_finished_idx",
        "outbox_msg_lease_idx",
        "outbox_msg_token_idx",
        "outbox_msg_worker_idx",
    )
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute("EXPLAIN " + sql)
            text = "\n".join(row[0] for row in cursor.fetchall())
            assert "Seq Scan" not in text, f"{sql}\n{text}"
            assert any(name in text for name in partial), f"{sql}\n{text}"


@pytest.fixture
def job_backlog():
    from django_outbox.jobs.models import Job

    now = timezone.now()
    Job.objects.bulk_create(
        Job(task_path="t.noop", queue_name=("default", "mail")[n % 2], available_at=now)
        for n in range(20_000)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_outbox_job")


@pytest.mark.parametrize(
    ("queues", "index"),
    [(None, "outbox_job_due_all_idx"), (["mail"], "outbox_job_due_idx")],
    ids=["every queue", "one queue"],
)
def test_a_job_claim_reads_the_backlog_in_order_instead_of_sorting_it(job_backlog, queues, index):
    """A worker's claim statement walks a due index in claim order and finds the claimed
    rows by primary key: its cost is the batch, not the backlog."""
    from django_outbox.engine.lease import Lease
    from django_outbox.jobs.running import Jobs

    runner = Jobs(queues=queues, batch_size=500)
    statement = runner._prepared(narrowed=False)
    assert statement is not None
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + statement.sql, statement.parameters(Lease.new(60, None)))
        text = "\n".join(row[0] for row in cursor.fetchall())
    assert index in text, text
    assert "Sort" not in text, text
    assert "Seq Scan" not in text, text


RUNNING_TOKEN = uuid.uuid4()


@pytest.fixture
def job_history():
    """20,000 finished jobs (2,000 of them in a batch) and a few RUNNING ones."""
    from django_outbox.jobs.models import Job, JobBatch, JobState

    now = timezone.now()
    batch = JobBatch.objects.create(total=2_000)
    Job.objects.bulk_create(
        Job(
            task_path="t.noop",
            state=JobState.SUCCESSFUL,
            finished_at=now,
            batch=batch if n % 10 == 0 else None,
        )
        for n in range(20_000)
    )
    Job.objects.bulk_create(
        Job(
            task_path="t.noop",
            state=JobState.RUNNING,
            locked_until=now,
            claimed_by=uuid.uuid4(),
            lock_token=RUNNING_TOKEN,
        )
        for _ in range(5)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_outbox_job")
    return batch


def test_the_jobs_sweeps_and_renewals_read_their_partial_indexes(job_history):
    """The heartbeat's lease renewal, the rescue of an expired lease or a dead worker's
    jobs, a fenced write, the batch sweep and the jobs' sweep each read a partial
    index, never the history (migration 0010 left one index over RUNNING jobs: it
    serves the lookups by lease, by token and by worker)."""
    from django.test.utils import CaptureQueriesContext

    from django_outbox.engine import sweeps
    from django_outbox.engine.heartbeat import Heartbeat, Held
    from django_outbox.engine.lease import Lease, fenced
    from django_outbox.jobs import maintenance
    from django_outbox.jobs.models import Job
    from django_outbox.jobs.running import Running

    beat = Heartbeat("jobs")
    running = list(Job.objects.filter(lock_token=RUNNING_TOKEN).values_list("pk", flat=True))
    held = Held(Running(), Lease(token=RUNNING_TOKEN, seconds=60), running)
    held.begin(running[:1])
    beat.hold(held)
    with CaptureQueriesContext(connection) as captured:
        beat.extend_leases()
        sweeps.rescue_stuck(Running(), dead_workers=[uuid.uuid4()], at=timezone.now())
        fenced(Job, Lease.new(60), "RUNNING", "default").update(locked_until=None)
        maintenance.sweep()
    statements = [
        q["sql"]
        for q in captured.captured_queries
        if '"django_outbox_job"' in q["sql"] and q["sql"].lstrip().startswith(("SELECT", "UPDATE"))
    ]
    assert len(statements) >= 7, statements
    partial = (
        "outbox_job_lease_idx",
        "outbox_job_batch_idx",
        "outbox_job_due_idx",
        "outbox_job_due_all_idx",
        "outbox_job_batch_active_idx",
    )
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute("EXPLAIN " + sql)
            text = "\n".join(row[0] for row in cursor.fetchall())
            assert "Seq Scan" not in text, f"{sql}\n{text}"
            assert any(name in text for name in partial), f"{sql}\n{text}"


def test_the_stale_sweep_check_reads_partial_indexes_when_nothing_waits(history):
    """The admin lists and the heartbeats ask whether a part has unfinished rows when its
    sweep is late; with none waiting the answer must not read the history."""
    from django.test.utils import CaptureQueriesContext

    from django_outbox.engine import sweeps

    OutboxMessage.objects.filter(state=OutboxState.SHOULD_BE_SENT).update(
        state=OutboxState.SENT, sent_at=timezone.now(), finished_at=timezone.now()
    )
    with CaptureQueriesContext(connection) as captured:
        assert sweeps.stale_sweeps() == []  # no sweep ever ran, but nothing waits
    statements = [
        q["sql"] for q in captured.captured_queries if '"django_outbox_message"' in q["sql"]
    ]
    assert len(statements) >= 2, statements
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute("EXPLAIN " + sql)
            text = "\n".join(row[0] for row in cursor.fetchall())
            assert "Seq Scan" not in text, f"{sql}\n{text}"
