"""Time-partitioned tables (``outbox_partition``): what partitioning changes, tested on
a test database whose three tables were converted before the session
(``make test-partitioned``). The rest of the suite that runs in that session proves
the engine works on them unchanged."""

from __future__ import annotations

import itertools
import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection, connections

import django_outbox
from django_outbox.engine import partitions, sweeps
from django_outbox.inbox.handling import Handling
from django_outbox.models import InboxMessage, InboxSeen, InboxState, Job, OutboxMessage
from django_outbox.outbox.relay import Publishing
from testproject.shop import jobs

pytestmark = [
    pytest.mark.partitioned,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture(autouse=True)
def coming_partitions():
    """Each test finds the partitions of the next days, whatever an earlier one dropped."""
    for model in (OutboxMessage, InboxMessage, Job):
        partitions.create_ahead(model, "default", ahead=5)
    yield
    for model in (OutboxMessage, InboxMessage, Job):
        partitions.create_ahead(model, "default", ahead=5)


def bounded():
    """The partitions after the first one (which is the table as it was converted)."""
    return [p for p in partitions.partitions(InboxMessage, "default") if not p.default][1:]


def move(model, pk, instant):
    """Give row *pk* another creation time (PostgreSQL moves it to that partition)."""
    column = partitions.column_of(model, "created_at")
    with connection.cursor() as cursor:
        cursor.execute(
            f'UPDATE "{model._meta.db_table}" SET "{column}" = %s WHERE id = %s', [instant, pk]
        )


def partition_of(model, pk):
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT tableoid::regclass::text FROM "{model._meta.db_table}" WHERE id = %s', [pk]
        )
        return cursor.fetchone()[0]


def test_each_table_is_partitioned_with_the_coming_intervals_and_a_default():
    for model in (OutboxMessage, InboxMessage, Job):
        shape = partitions.layout(model, "default")
        assert shape is not None and shape.interval == "day"
        found = partitions.partitions(model, "default")
        assert found[0].name.endswith("_legacy") and found[0].lower is None
        assert found[-1].default
        days = [p for p in found[1:] if not p.default]
        assert len(days) >= 4  # --ahead 5: up to five days after today, from the cut-over
        for earlier, later in itertools.pairwise(days):
            assert earlier.upper == later.lower == earlier.lower + timedelta(days=1)


def test_a_duplicate_is_refused_whichever_partition_holds_the_first():
    first, created = django_outbox.receive("t", {"n": 1}, source="s", message_id="m-1")
    day = bounded()[1]
    move(InboxMessage, first.pk, day.lower + timedelta(hours=1))
    assert partition_of(InboxMessage, first.pk) == day.name
    again, created_again = django_outbox.receive("t", {"n": 2}, source="s", message_id="m-1")
    assert (created, created_again) == (True, False)
    assert again.pk == first.pk and again.payload == {"n": 1}
    # Another source's same id is another message.
    _, other = django_outbox.receive("t", {}, source="s2", message_id="m-1")
    assert other
    assert InboxMessage.objects.count() == 2
    assert set(InboxSeen.objects.values_list("source", "message_id")) == {
        ("s", "m-1"),
        ("s2", "m-1"),
    }


def test_a_batch_stores_each_new_id_once_and_counts_the_rest_as_duplicates():
    from django_outbox.inbox.api import prepare, receive_many

    django_outbox.receive("t", {}, source="s", message_id="old")
    batch = [
        prepare("t", {"n": n}, source="s", message_id=mid)
        for n, mid in enumerate(["old", "a", "b", "a", "c", "b"])
    ]
    new, duplicates = receive_many(batch)
    # The first of each repeated id within the batch is the one kept.
    assert [(m.message_id, m.payload["n"]) for m in new] == [("a", 1), ("b", 2), ("c", 4)]
    assert duplicates == 3
    assert InboxMessage.objects.count() == 4


def at_once(count, call):
    """*call*'s results in *count* threads started together, each on its own connection."""
    barrier = threading.Barrier(count)
    results = []

    def run() -> None:
        try:
            barrier.wait()
            results.append(call())
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_concurrent_receives_of_one_id_store_it_once():
    created = at_once(6, lambda: django_outbox.receive("t", {}, source="s", message_id="race")[1])
    assert len(created) == 6 and sorted(created) == [False] * 5 + [True]
    assert InboxMessage.objects.filter(message_id="race").count() == 1


def test_an_id_whose_message_was_dropped_with_its_partition_is_stored_again():
    """Without partitions the purge forgets an id with its row; with them the seen
    table may remember it a little longer, and that must not wedge a redelivery."""
    first, _ = django_outbox.receive("t", {}, source="s", message_id="gone")
    InboxMessage.objects.filter(pk=first.pk).delete()  # as a dropped partition would
    assert InboxSeen.objects.filter(message_id="gone").exists()
    again, created = django_outbox.receive("t", {"new": True}, source="s", message_id="gone")
    assert created and again.pk != first.pk


def test_concurrent_enqueues_of_one_unique_key_make_one_job():
    ids = at_once(6, lambda: jobs.sync_customer.enqueue(customer="c-race").id)
    assert len(ids) == 6 and len(set(ids)) == 1
    assert Job.objects.filter(unique_key="sync-c-race").count() == 1


def test_the_purge_drops_a_partition_once_every_row_in_it_finished_before_the_cutoff():
    days = bounded()
    done, kept_back = days[0], days[1]
    # Three handled messages in the first day; one still waiting in the second.
    for n in range(3):
        message, _ = django_outbox.receive("t", {}, source="s", message_id=f"done-{n}")
        move(InboxMessage, message.pk, done.lower + timedelta(hours=1))
    InboxMessage.objects.filter(message_id__startswith="done-").update(
        state=InboxState.HANDLED, finished_at=done.lower + timedelta(hours=2)
    )
    waiting, _ = django_outbox.receive("t", {}, source="s", message_id="waiting")
    move(InboxMessage, waiting.pk, kept_back.lower + timedelta(hours=1))
    # Beside it, a handled one: its partition stays, so it is deleted as a row.
    beside, _ = django_outbox.receive("t", {}, source="s", message_id="beside")
    move(InboxMessage, beside.pk, kept_back.lower + timedelta(hours=2))
    InboxMessage.objects.filter(pk=beside.pk).update(
        state=InboxState.HANDLED, finished_at=kept_back.lower + timedelta(hours=3)
    )
    # The first partition (the table before the conversion) keeps a waiting row too.
    django_outbox.receive("t", {}, source="s", message_id="now")

    at = kept_back.upper + timedelta(days=2)
    sweeps.purge_finished(Handling(), older_than=timedelta(days=1), at=at)

    names = {p.name for p in partitions.partitions(InboxMessage, "default")}
    assert done.name not in names
    assert kept_back.name in names
    assert set(InboxMessage.objects.values_list("message_id", flat=True)) == {"waiting", "now"}


def test_a_partition_with_a_row_finished_after_the_cutoff_or_holding_its_key_stays():
    days = [p for p in partitions.partitions(OutboxMessage, "default") if not p.default][1:]
    late, blocking = days[0], days[1]
    one = django_outbox.send("t", {}, to="default")
    two = django_outbox.send("t", {}, to="default", key="k")
    move(OutboxMessage, one.pk, late.lower + timedelta(hours=1))
    move(OutboxMessage, two.pk, blocking.lower + timedelta(hours=1))
    at = blocking.upper + timedelta(days=2)
    cutoff = at - timedelta(days=1)
    OutboxMessage.objects.filter(pk=one.pk).update(state="sent", finished_at=cutoff, sent_at=cutoff)
    OutboxMessage.objects.filter(pk=two.pk).update(
        state="cancelled", finished_at=late.lower, blocking=True
    )
    sweeps.purge_finished(Publishing(), older_than=timedelta(days=1), at=at)
    names = {p.name for p in partitions.partitions(OutboxMessage, "default")}
    assert {late.name, blocking.name} <= names
    assert OutboxMessage.objects.count() == 2


def test_the_purge_makes_the_coming_partitions():
    shape = partitions.layout(Job, "default")
    last = [p for p in partitions.partitions(Job, "default") if not p.default][-1]
    with connection.cursor() as cursor:
        cursor.execute(f'DROP TABLE "{last.name}"')
    made = partitions.create_ahead(Job, "default", ahead=10)
    # The dropped day is made again, and the days after it.
    assert last.name in made
    assert all(name.startswith(f"{shape.table}_p") for name in made)
    days = [p for p in partitions.partitions(Job, "default") if not p.default][1:]
    assert all(a.upper == b.lower for a, b in itertools.pairwise(days))
    # Jobs run on the partitioned table as always.
    result = jobs.add.enqueue(2, 3)
    assert Job.objects.get(result_id=uuid.UUID(result.id)).state == "READY"


def test_a_row_of_an_interval_not_wholly_past_the_cutoff_waits_for_its_partition():
    day = bounded()[0]
    django_outbox.receive("t", {}, source="s", message_id="now")  # keeps the first partition
    message, _ = django_outbox.receive("t", {}, source="s", message_id="young")
    move(InboxMessage, message.pk, day.lower + timedelta(hours=1))
    InboxMessage.objects.filter(pk=message.pk).update(
        state=InboxState.HANDLED, finished_at=day.lower + timedelta(hours=1)
    )
    # The cut-off falls inside the row's day: finished before it, but its day is not
    # wholly past, so neither the partition nor the row goes yet.
    at = day.lower + timedelta(hours=2, days=1)
    sweeps.purge_finished(Handling(), older_than=timedelta(days=1), at=at)
    assert InboxMessage.objects.filter(pk=message.pk).exists()
    # Once the day is wholly past, the partition goes, and the row with it.
    sweeps.purge_finished(
        Handling(), older_than=timedelta(days=1), at=day.upper + timedelta(days=1)
    )
    assert not InboxMessage.objects.filter(pk=message.pk).exists()
    assert day.name not in {p.name for p in partitions.partitions(InboxMessage, "default")}
