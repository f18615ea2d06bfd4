"""inbox_consume against real RabbitMQ and Redis: our outbox's messages stored once,
acknowledged, handled; duplicates suppressed; unreadable ones kept with their body."""

import io
import json

import pytest
from django.core.management import call_command
from kombu import Connection

import django_outbox
from django_outbox.models import InboxMessage, InboxState, OutboxMessage, OutboxState
from django_outbox.outbox.relay import Relay
from testproject.shop.models import Payment
from tests.integration.test_kombu_transport import drain_queue

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["rabbitmq", "redis"])
def broker_url(request):
    return request.getfixturevalue("amqp_url" if request.param == "rabbitmq" else "redis_url")


@pytest.fixture
def wired(configure_outbox, broker_url, queue_name):
    """This service's outbox publishes to a queue that its own inbox consumes."""
    configure_outbox(
        DESTINATIONS={"default": {"TRANSPORT": "kombu", "URL": broker_url, "QUEUE": queue_name}},
        INBOX={"SOURCES": {"shop": {"TRANSPORT": "kombu", "URL": broker_url, "QUEUE": queue_name}}},
    )
    return broker_url, queue_name


def consume(*args):
    out = io.StringIO()
    call_command("inbox_consume", "--json", "--until-idle", "1", *args, stdout=out)
    return json.loads(out.getvalue().strip().splitlines()[-1])


def test_messages_are_stored_once_and_handled(wired):
    for n in range(5):
        django_outbox.send("payment.captured", {"order": f"o{n}"}, key=f"order:{n % 2}")
    assert Relay().drain().sent == 5
    # Publish them all again: a producer that retried after a lost confirm.
    OutboxMessage.objects.update(state=OutboxState.SHOULD_BE_SENT)
    assert Relay().drain().sent == 5
    counts = consume()
    assert (counts["received"], counts["stored"], counts["duplicates"]) == (10, 5, 5)
    assert counts["handled"] == 5
    assert InboxMessage.objects.filter(state=InboxState.HANDLED).count() == 5
    assert sorted(Payment.objects.values_list("order_ref", flat=True)) == [
        f"o{n}" for n in range(5)
    ]
    stored = InboxMessage.objects.get(payload__order="o3")
    sent = OutboxMessage.objects.get(payload__order="o3")
    assert (stored.source, stored.message_id) == ("shop", str(sent.message_id))
    assert (stored.key, stored.sequence) == ("order:1", sent.sequence)
    # Everything was acknowledged: the queue is empty.
    broker_url, queue_name = wired
    assert drain_queue(broker_url, queue_name, timeout=0.5) == []


def test_unreadable_messages_are_kept_with_their_body_and_acknowledged(wired):
    broker_url, queue_name = wired
    with Connection(broker_url) as connection:
        producer = connection.Producer()
        queue = connection.SimpleQueue(queue_name)  # declares it
        queue.close()
        producer.publish(
            b"{not json",
            routing_key=queue_name,
            content_type="application/json",
            content_encoding="binary",
            headers={"outbox-type": "payment.captured", "outbox-message-id": "bad-1"},
        )
        producer.publish(
            b'{"order": "x"}',
            routing_key=queue_name,
            content_type="application/json",
            content_encoding="binary",
            headers={"outbox-message-id": "no-type"},
        )
    counts = consume()
    assert (counts["received"], counts["unreadable"], counts["stored"]) == (2, 2, 0)
    bad = InboxMessage.objects.get(message_id="bad-1")
    assert bad.state == InboxState.HANDLE_ERROR
    assert bad.last_error.startswith("unreadable: body is not UTF-8 JSON")
    assert bad.raw_body == "{not json"
    untyped = InboxMessage.objects.get(message_id="no-type")
    assert (
        untyped.last_error == "unreadable: no message type (header, or DEFAULT_TYPE of the source)"
    )
    assert drain_queue(broker_url, queue_name, timeout=0.5) == []


def test_a_source_that_is_not_configured_is_refused(wired):
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="unknown inbox source 'shp'.*did you mean 'shop'"):
        consume("shp")
