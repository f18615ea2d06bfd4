"""Messages whose values PostgreSQL refuses (a NUL in the type, a header, the message
id or the key; a sequence beyond BIGINT), and no database should store as they are,
reach a real ``inbox_consume`` process from RabbitMQ, or the Celery task
``django_outbox.receive`` through a real worker, mixed with good ones: the good ones
are handled, the bad ones are kept as ``handle_error`` with the reason, and nothing
goes back to the queue again and again."""

import io
import itertools
import json
import subprocess
import sys

import pytest
from celery import current_app
from django.db import connection
from kombu import Connection

from django_outbox.models import InboxMessage, InboxState
from testproject.shop.models import Payment
from tests.acceptance.helpers import stop, wait_for
from tests.conftest import ROOT, spawn_manage, subprocess_env
from tests.integration.test_kombu_transport import drain_queue

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

GOOD = [(f"good-{n}", {"outbox-type": "payment.captured"}) for n in range(3)]
#: (message id, headers, what its last_error says).
BAD = [
    ("bad-type", {"outbox-type": "payment\x00captured"}, "type 'payment\\x00captured'"),
    # Any outbox-* header travels with a Celery task too (other names only over kombu).
    ("bad-header", {"outbox-type": "payment.captured", "outbox-trace": "a\x00b"}, "'outbox-trace'"),
    ("bad\x00id", {"outbox-type": "payment.captured"}, "message_id 'bad\\x00id'"),
    ("bad-key", {"outbox-type": "payment.captured", "outbox-key": "order:\x00"}, "key 'order"),
    (
        "bad-sequence",
        {"outbox-type": "payment.captured", "outbox-key": "o:1", "outbox-sequence": "9" * 20},
        "sequence 99999999999999999999 is out of range",
    ),
]


def mixed_batch():
    """The good and bad messages interleaved, as (message id, headers, payload)."""
    bad = [(message_id, headers) for message_id, headers, _ in BAD]
    pairs = itertools.chain.from_iterable(itertools.zip_longest(GOOD, bad))
    return [(m, headers, {"order": m}) for m, headers in filter(None, pairs)]


def stored_as_errors():
    """The bad messages' rows, by the id they were stored under (NUL escaped)."""
    rows = InboxMessage.objects.filter(state=InboxState.HANDLE_ERROR)
    return {row.message_id: row for row in rows}


def assert_kept_with_reasons(rows):
    assert set(rows) == {message_id.replace("\x00", "\\x00") for message_id, _, _ in BAD}
    for message_id, headers, reason in BAD:
        row = rows[message_id.replace("\x00", "\\x00")]
        assert row.last_error.startswith("unreadable: "), row.last_error
        assert reason in row.last_error, row.last_error
        assert "\x00" not in json.dumps(row.headers)
        # The original values are kept, escaped, for the operator to read.
        for name, value in headers.items():
            assert row.headers[name] == value.replace("\x00", "\\x00")


@pytest.mark.rabbitmq
def test_inbox_consume_keeps_unstorable_messages_and_handles_the_rest_of_the_batch(
    configure_outbox, amqp_url, queue_name
):
    configure_outbox(
        INBOX={"SOURCES": {"shop": {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": queue_name}}}
    )
    batch = mixed_batch()
    with Connection(amqp_url) as broker:
        broker.SimpleQueue(queue_name).close()
        producer = broker.Producer()
        for message_id, headers, payload in batch:
            producer.publish(
                payload,
                routing_key=queue_name,
                serializer="json",
                headers={"outbox-message-id": message_id, **headers},
            )
    # One batch: before the fix PostgreSQL refused it whole, and it was requeued forever.
    consumer = spawn_manage("inbox_consume", "--json", "--batch", "50", "--until-idle", "2")
    try:
        output, _ = consumer.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        output = stop(consumer)
        raise AssertionError(f"inbox_consume never went idle:\n{output[-3000:]}") from None
    assert consumer.returncode == 0, output
    counts = json.loads(output.strip().splitlines()[-1])
    assert counts["received"] == len(batch), output  # each delivered once: none requeued
    assert counts["unreadable"] == len(BAD)
    assert sorted(Payment.objects.values_list("order_ref", flat=True)) == [
        message_id for message_id, _ in GOOD
    ]
    assert InboxMessage.objects.filter(state=InboxState.HANDLED).count() == len(GOOD)
    assert_kept_with_reasons(stored_as_errors())
    assert drain_queue(amqp_url, queue_name, timeout=0.5) == []


@pytest.mark.redis
def test_the_celery_receive_task_keeps_unstorable_messages(configure_outbox, queue_name):
    configure_outbox(INBOX={"SOURCES": {"peer": {"TRANSPORT": "celery", "QUEUE": queue_name}}})
    batch = mixed_batch()
    for message_id, headers, payload in batch:
        # What our celery transport sends: the payload, the message id as task id.
        current_app.send_task(
            "django_outbox.receive",
            args=[payload],
            task_id=message_id,
            headers={"outbox-message-id": message_id, **headers},
            queue=queue_name,
        )
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "testproject", "worker", "--pool=solo"),
            *("-Q", queue_name, "--without-heartbeat", "--without-gossip", "--without-mingle"),
        ],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(
            lambda: InboxMessage.objects.filter(source="peer").count() == len(batch),
            timeout=60,
            what="every delivery to be stored",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the worker said:\n{stop(worker)[-4000:]}") from None
    finally:
        output = stop(worker) if worker.poll() is None else ""
    assert sorted(Payment.objects.values_list("order_ref", flat=True)) == [
        message_id for message_id, _ in GOOD
    ], output
    assert_kept_with_reasons(stored_as_errors())


@pytest.fixture
def refuse_in_database():
    """Add a CHECK constraint to the inbox table for the test: the database itself
    refuses rows that passed every check of ours (defence in depth)."""
    added = []

    def refuse(name, condition):
        with connection.cursor() as cursor:
            cursor.execute(
                f"ALTER TABLE django_outbox_inbox ADD CONSTRAINT {name} CHECK ({condition})"
            )
        added.append(name)

    yield refuse
    with connection.cursor() as cursor:
        for name in added:
            cursor.execute(f"ALTER TABLE django_outbox_inbox DROP CONSTRAINT IF EXISTS {name}")


@pytest.mark.postgres  # the CHECK constraints are written for PostgreSQL
@pytest.mark.rabbitmq
def test_a_batch_the_database_refuses_is_stored_one_by_one(
    configure_outbox, amqp_url, queue_name, refuse_in_database, caplog
):
    """A row the database refuses for a reason we do not check in Python is kept as
    ``handle_error`` with the database's error; one that cannot be stored even so (it
    is refused in every form) is rejected, logged with its body's hash, and does not
    hold back its batch."""
    from django.core.management import call_command

    configure_outbox(
        INBOX={"SOURCES": {"shop": {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": queue_name}}}
    )
    refuse_in_database("test_no_refused_payload", "payload IS NULL OR NOT payload ? 'refused'")
    refuse_in_database("test_no_poison_type", "type <> 'poison.pill'")
    with Connection(amqp_url) as broker:
        broker.SimpleQueue(queue_name).close()
        producer = broker.Producer()
        for message_id, message_type, payload in [
            ("ok-1", "payment.captured", {"order": "ok-1"}),
            ("refused-1", "payment.captured", {"order": "refused-1", "refused": True}),
            ("pill-1", "poison.pill", {"order": "pill-1"}),
            ("ok-2", "payment.captured", {"order": "ok-2"}),
        ]:
            producer.publish(
                payload,
                routing_key=queue_name,
                serializer="json",
                headers={"outbox-message-id": message_id, "outbox-type": message_type},
            )
    out = io.StringIO()
    call_command("inbox_consume", "--json", "--batch", "50", "--until-idle", "1", stdout=out)
    counts = json.loads(out.getvalue().strip().splitlines()[-1])
    assert counts["received"] == 4
    assert sorted(Payment.objects.values_list("order_ref", flat=True)) == ["ok-1", "ok-2"]
    refused = InboxMessage.objects.get(message_id="refused-1")
    assert refused.state == InboxState.HANDLE_ERROR
    assert refused.last_error.startswith("unreadable: cannot be stored: IntegrityError")
    assert "test_no_refused_payload" in refused.last_error
    assert refused.raw_body == '{"order": "refused-1", "refused": true}'
    assert not InboxMessage.objects.filter(message_id="pill-1").exists()
    [line] = [r.getMessage() for r in caplog.records if "pill-1" in r.getMessage()]
    assert "could not be stored" in line and "sha256:" in line
    assert drain_queue(amqp_url, queue_name, timeout=0.5) == []
