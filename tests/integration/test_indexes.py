"""Hot queries use the partial indexes, so their cost follows the backlog, not history."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_outbox.models import OutboxMessage, OutboxState
from django_outbox.outbox.relay import Relay

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]


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
    now = timezone.now()
    # As purge_in_batches queries: the retained history is younger than the cut-off.
    purge = OutboxMessage.objects.purgeable(now - timedelta(days=7)).order_by().values("pk")
    assert "outbox_msg_finished_idx" in plan(purge[:1000])
    # Any partial index over "sending" rows bounds the rescue by what is in flight.
    stuck = plan(OutboxMessage.objects.stuck(now).values("pk"))
    sending_indexes = ("outbox_msg_lease_idx", "outbox_msg_token_idx", "outbox_msg_worker_idx")
    assert any(name in stuck for name in sending_indexes), stuck
    assert "Seq Scan" not in stuck


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
