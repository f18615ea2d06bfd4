"""kombu transport against real RabbitMQ and Redis: commit publishes, rollback does not."""

import pytest
from django.db import transaction
from kombu import Connection

import django_outbox
from django_outbox.models import OutboxMessage, OutboxState
from django_outbox.outbox.relay import Relay

pytestmark = pytest.mark.django_db(transaction=True)

HEADERS = (
    "outbox-message-id",
    "outbox-type",
    "outbox-key",
    "outbox-sequence",
    "outbox-correlation-id",
    "outbox-created-at",
    "outbox-attempt",
)


def drain_queue(url, queue, *, transport_options=None, timeout=1.0):
    """Every message currently in *queue*, acknowledged."""
    received = []
    with Connection(url, transport_options=transport_options or {}) as connection:
        simple = connection.SimpleQueue(queue)
        try:
            while True:
                try:
                    message = simple.get(timeout=timeout)
                except simple.Empty:
                    break
                received.append(message)
                message.ack()
        finally:
            simple.close()
    return received


@pytest.fixture(params=["rabbitmq", "redis"])
def broker(request, configure_outbox, queue_name):
    if request.param == "rabbitmq":
        url = request.getfixturevalue("amqp_url")
    else:
        url = request.getfixturevalue("redis_url")
    configure_outbox(
        DESTINATIONS={"default": {"TRANSPORT": "kombu", "URL": url, "QUEUE": queue_name}}
    )
    if request.param == "rabbitmq":
        # Declare the queue first so a rollback test has something to read from.
        with Connection(url) as connection:
            connection.SimpleQueue(queue_name).close()
    yield url, queue_name
    if request.param == "rabbitmq":
        with Connection(url) as connection:
            connection.default_channel.queue_delete(queue_name)


def test_committed_message_reaches_the_broker_with_all_headers(broker):
    url, queue = broker
    with transaction.atomic():
        message = django_outbox.send(
            "order.created",
            {"order_id": 7, "total": "9.90"},
            key="order:7",
            headers={"tenant": "acme"},
            correlation_id="req-1",
        )
    assert Relay().drain().sent == 1
    [received] = drain_queue(url, queue)
    assert received.payload == {"order_id": 7, "total": "9.90"}
    assert received.content_type == "application/json"
    assert set(HEADERS) <= set(received.headers)
    assert received.headers["outbox-message-id"] == str(message.message_id)
    assert received.headers["outbox-type"] == "order.created"
    assert received.headers["outbox-key"] == "order:7"
    assert received.headers["outbox-sequence"] == "1"
    assert received.headers["outbox-correlation-id"] == "req-1"
    assert received.headers["tenant"] == "acme"
    assert received.properties["message_id"] == str(message.message_id)
    assert received.properties["delivery_mode"] == 2


def test_rolled_back_message_never_reaches_the_broker(broker):
    url, queue = broker
    with pytest.raises(RuntimeError), transaction.atomic():
        django_outbox.send("order.created", {"order_id": 1})
        raise RuntimeError("payment declined")
    with transaction.atomic():
        sentinel = django_outbox.send("order.sentinel", {})
    Relay().drain()
    received = drain_queue(url, queue)
    assert [m.headers["outbox-message-id"] for m in received] == [str(sentinel.message_id)]
    assert OutboxMessage.objects.count() == 1


def test_batch_is_published_in_order_and_confirmed(broker):
    url, queue = broker
    sent = [django_outbox.send("t", {"n": n}, key="k").message_id for n in range(250)]
    assert Relay(batch_size=100).drain().sent == 250
    received = drain_queue(url, queue)
    assert [m.headers["outbox-message-id"] for m in received] == [str(m) for m in sent]
    assert not OutboxMessage.objects.exclude(state=OutboxState.SENT).exists()


def test_other_kombu_urls_publish_through_kombus_producer(configure_outbox, queue_name):
    # kombu's in-process memory transport stands for filesystem://, SQS & co.
    configure_outbox(
        DESTINATIONS={"default": {"TRANSPORT": "kombu", "URL": "memory://", "QUEUE": queue_name}}
    )
    message = django_outbox.send("order.created", {"order_id": 3}, key="order:3")
    assert Relay().drain().sent == 1
    [received] = drain_queue("memory://", queue_name, timeout=0.2)
    assert received.payload == {"order_id": 3}
    assert received.headers["outbox-message-id"] == str(message.message_id)
    assert received.headers["outbox-sequence"] == "1"


def test_rabbitmq_message_no_queue_takes_is_not_recorded_as_sent(configure_outbox, amqp_url):
    # The default exchange with a routing key no queue has: RabbitMQ would
    # confirm and drop it; published as mandatory, it comes back instead.
    configure_outbox(
        DESTINATIONS={
            "default": {"TRANSPORT": "kombu", "URL": amqp_url, "ROUTING_KEY": "nobody-{type}"}
        }
    )
    message = django_outbox.send("order.created", {"order_id": 1})
    result = Relay().drain()
    message.refresh_from_db()
    assert (result.sent, result.retried) == (0, 1)
    assert message.state == OutboxState.SHOULD_BE_SENT
    assert "unroutable" in message.last_error
    assert "'nobody-order.created'" in message.last_error


def test_rabbitmq_a_returned_message_holds_back_the_rest_of_its_key(
    configure_outbox, amqp_url, queue_name
):
    # Message 1 of key "k" is unroutable; 2 and 3 would be confirmed. They must
    # wait for 1's confirm, then stay unattempted: never published ahead of it.
    exchange = f"{queue_name}-ex"
    configure_outbox(
        DESTINATIONS={
            "default": {
                "TRANSPORT": "kombu",
                "URL": amqp_url,
                "EXCHANGE": exchange,
                "QUEUE": queue_name,
                "ROUTING_KEY": "{type}",
                "BINDING_KEY": "ok",
            }
        }
    )
    first = django_outbox.send("lost", {"n": 1}, key="k")
    behind = [django_outbox.send("ok", {"n": n}, key="k") for n in (2, 3)]
    other = django_outbox.send("ok", {"n": 1}, key="j")
    try:
        result = Relay().run_batch()
        received = drain_queue(amqp_url, queue_name)
    finally:
        with Connection(amqp_url) as connection:
            connection.default_channel.queue_delete(queue_name)
            connection.default_channel.exchange_delete(exchange)
    assert [m.headers["outbox-message-id"] for m in received] == [str(other.message_id)]
    assert (result.sent, result.retried, result.released) == (1, 1, 2)
    first.refresh_from_db()
    assert "unroutable" in first.last_error
    for message in behind:
        message.refresh_from_db()
        assert (message.state, message.attempts) == (OutboxState.SHOULD_BE_SENT, 0)
