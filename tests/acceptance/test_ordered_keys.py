"""Ordered inbox keys under concurrency, with real processes: two ``inbox_consume``
and two ``inbox_worker`` processes share messages of ``strict`` and ``latest`` keys
that arrive shuffled through RabbitMQ. Two workers never handle one key at once,
``strict`` keys are handled in sequence order exactly once, ``latest`` keys end at
their newest state, and nobody deadlocks or dies on the way."""

import random
import time

import pytest
from django.db import connection, transaction
from kombu import Connection

import django_outbox
from django_outbox.engine.models import Worker
from django_outbox.models import InboxMessage, InboxState
from testproject.shop.models import OrderStatus, Payment
from tests.acceptance.helpers import describe_outputs, finish, read_as_it_comes, wait_for
from tests.conftest import spawn_manage, subprocess_env

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.row_locks,
    pytest.mark.processes,
]

KEYS = 10
SEQUENCES = 10


def check_strict_keys(keys, sequences):
    """Every step of every strict key handled once, in sequence order."""
    for k in range(keys):
        steps = list(
            Payment.objects.filter(order_ref=f"step-{k}")
            .order_by("pk")
            .values_list("sequence", flat=True)
        )
        assert steps == list(range(1, sequences + 1)), (k, steps)


def deadlocks():
    """Deadlocks the database has detected so far (its own counter: a retried victim
    leaves no trace in the workers' output)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
            )
        else:
            cursor.execute("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
            return int(cursor.fetchone()[1])
        return int(cursor.fetchone()[0])


def check_quiet(processes, outputs, deadlocks_before):
    # PostgreSQL's statistics reach pg_stat_database within a moment.
    time.sleep(1.0)
    assert deadlocks() == deadlocks_before
    log = "\n".join(outputs)
    assert "deadlock" not in log.lower(), log
    assert "Traceback" not in log, log
    assert all(p.returncode == 0 for p in processes), log


def test_stored_messages_of_one_key_split_across_workers_batches_do_not_deadlock(
    configure_outbox,
):
    """Messages stored first (a webhook, ``receive()``), then claimed by four workers in
    batches of five: each key's run of messages is split across concurrent batches. A
    batch that handled a key's message wakes the next one, which another batch holds:
    it must not wait for that row while holding the key's cursor (which the other batch
    waits for), or PostgreSQL aborts one of them as a deadlock victim."""
    configure_outbox(INBOX={"SOURCES": {"shop": {"TRANSPORT": "local"}}}, BATCH_SIZE=5)
    keys, sequences = 10, 40
    before = deadlocks()
    workers = [
        read_as_it_comes(
            spawn_manage(
                "inbox_worker",
                "--json",
                "--interval",
                "0.05",
                env=subprocess_env(TESTPROJECT_HANDLER_DELAY="0.005"),
            )
        )
        for _ in range(4)
    ]
    outputs = []
    try:
        wait_for(lambda: Worker.objects.count() == 4, timeout=60, what="the workers to start")
        with transaction.atomic():  # all due at once: the four batches overlap
            for k in range(keys):
                for n in range(1, sequences + 1):
                    django_outbox.receive(
                        "order.step",
                        {},
                        source="shop",
                        message_id=f"step-{k}-{n}",
                        key=f"step-{k}",
                        sequence=n,
                    )
        wait_for(
            lambda: (
                InboxMessage.objects.filter(state=InboxState.HANDLED).count() == keys * sequences
            ),
            timeout=90,
            what="every message to be handled",
        )
        assert all(p.poll() is None for p in workers), "a worker died"
    finally:
        outputs = [finish(p) for p in workers]
    check_quiet(workers, outputs, before)
    check_strict_keys(keys, sequences)
    assert set(InboxMessage.objects.values_list("attempts", flat=True)) == {1}


def publish_shuffled(url, queue):
    """Every (type, key, sequence) once, in a random order (seeded: reproducible)."""
    messages = [
        (kind, f"{kind[6:]}-{k}", n)
        for kind in ("order.step", "order.status")
        for k in range(KEYS)
        for n in range(1, SEQUENCES + 1)
    ]
    random.Random(14).shuffle(messages)
    with Connection(url) as connection:
        producer = connection.Producer()
        for kind, key, n in messages:
            producer.publish(
                {"status": f"s{n}"},
                routing_key=queue,
                serializer="json",
                headers={
                    "outbox-message-id": f"{key}-{n}",
                    "outbox-type": kind,
                    "outbox-key": key,
                    "outbox-sequence": str(n),
                },
            )
    return len(messages)


@pytest.mark.rabbitmq
def test_two_consumers_and_two_workers_keep_every_key_in_order_without_deadlocks(
    configure_outbox, amqp_url, queue_name
):
    configure_outbox(
        INBOX={"SOURCES": {"shop": {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": queue_name}}}
    )
    with Connection(amqp_url) as connection:
        connection.SimpleQueue(queue_name).close()  # declared before anyone publishes
    before = deadlocks()
    processes = [
        read_as_it_comes(spawn_manage("inbox_consume", "--json", "--batch", "20")) for _ in range(2)
    ] + [
        read_as_it_comes(spawn_manage("inbox_worker", "--json", "--interval", "0.1"))
        for _ in range(2)
    ]
    outputs = []
    stalled = None
    finished = (InboxState.HANDLED, InboxState.SKIPPED)
    try:
        started = time.monotonic()
        total = publish_shuffled(amqp_url, queue_name)
        try:
            wait_for(
                lambda: InboxMessage.objects.filter(state__in=finished).count() == total,
                timeout=90,
                what="every message to be handled or skipped",
            )
        except AssertionError as exc:
            stalled = exc
        took = time.monotonic() - started
        assert all(p.poll() is None for p in processes), "a process died"
    finally:
        outputs = [finish(p) for p in processes]
    if stalled is not None:
        # What was left, and what each process said, to tell a stall from a slow run.
        left = InboxMessage.objects.exclude(state__in=finished).order_by("key", "sequence")
        rows = list(
            left.values_list(
                "message_id", "state", "key", "sequence", "attempts", "available_at", "last_error"
            )[:30]
        )
        raise AssertionError(
            f"{stalled}: {left.count()} left, the first: {rows}\n"
            + describe_outputs(["consume 1", "consume 2", "worker 1", "worker 2"], outputs)
        )
    check_quiet(processes, outputs, before)
    check_strict_keys(KEYS, SEQUENCES)
    # latest: each key ends at its newest status; older arrivals were skipped, not lost.
    assert {s.order_ref: s.sequence for s in OrderStatus.objects.all()} == {
        f"status-{k}": SEQUENCES for k in range(KEYS)
    }
    assert not InboxMessage.objects.filter(state=InboxState.HANDLE_ERROR).exists()
    assert took < 60, f"{took:.1f}s for {total} messages"
