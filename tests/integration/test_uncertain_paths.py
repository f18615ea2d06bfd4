"""Publishes whose answer is lost on a real socket are uncertain, not failed.

A TCP proxy sits between the relay and a real RabbitMQ or Redis. The
request reaches the broker; the answer (a publisher confirm, Redis's reply)
is swallowed or the connection is cut right after the request. The message
did arrive, so the outcome is uncertain: a ``hold`` destination parks it for
an operator instead of resending it. A refused connection, where nothing
left the process, is not an attempt at all: the destination's circuit opens
and the message waits for it, uncounted.
"""

import json

import pytest
import redis

import django_outbox
from django_outbox.models import OutboxMessage, OutboxState
from django_outbox.outbox.circuits import CircuitState, circuits
from django_outbox.outbox.relay import Relay
from tests import services
from tests.integration.test_kombu_transport import drain_queue
from tests.proxy import TcpProxy

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["rabbitmq", "redis"])
def through_proxy(request, configure_outbox, queue_name):
    """A hold destination on a real broker behind a proxy; yields (proxy, broker, url)."""
    broker = request.param
    if broker == "rabbitmq":
        real_url = request.getfixturevalue("amqp_url")
        proxy = TcpProxy(services.SERVICES["rabbitmq"])
        url = f"amqp://guest:guest@127.0.0.1:{proxy.port}//"
    else:
        real_url = request.getfixturevalue("redis_url")
        proxy = TcpProxy(services.SERVICES["redis"])
        url = f"redis://127.0.0.1:{proxy.port}/{real_url.rsplit('/', 1)[1]}"
    proxy.up()
    configure_outbox(
        DESTINATIONS={
            "default": {
                "TRANSPORT": "kombu",
                "URL": url,
                "QUEUE": queue_name,
                "UNCERTAIN": "hold",
                "TIMEOUT": 1.0,
            }
        },
    )
    # A first message goes through untouched: the connection (and, on AMQP,
    # its handshake and confirm mode) is set up before the answers go missing.
    django_outbox.send("warm.up", {})
    assert Relay().drain().sent == 1
    yield proxy, broker, real_url
    proxy.down()


def queued_ids(broker, url, queue):
    if broker == "rabbitmq":
        return [m.headers["outbox-message-id"] for m in drain_queue(url, queue, timeout=1.0)]
    client = redis.Redis.from_url(url)
    return [json.loads(raw)["headers"]["outbox-message-id"] for raw in client.lrange(queue, 0, -1)]


@pytest.mark.parametrize("mode", ["swallow_replies", "cut_after_request"])
def test_a_lost_answer_makes_the_outcome_uncertain(through_proxy, queue_name, mode):
    proxy, broker, real_url = through_proxy
    proxy.mode = mode
    message = django_outbox.send("order.created", {"order_id": 1})
    result = Relay().drain()
    message.refresh_from_db()
    assert (result.sent, result.failed) == (0, 1)
    assert message.state == OutboxState.SEND_ERROR
    assert message.last_error.startswith("outcome uncertain, held for an operator")
    if mode == "swallow_replies":
        # Not a guess: the broker did take the message whose answer was lost.
        assert str(message.message_id) in queued_ids(broker, real_url, queue_name)


def test_a_refused_connection_is_not_an_attempt(through_proxy):
    proxy, _, _ = through_proxy
    proxy.mode = "cut_after_request"
    django_outbox.send("breaks.the.connection", {})
    Relay().drain()
    # The dropped connection opened the destination's circuit; a relay that has not
    # seen it yet (a fresh process) tries, and finds nothing listening.
    circuits.reset()
    proxy.down()  # from now on nothing listens on the proxy's port
    message = django_outbox.send("order.created", {"order_id": 2})
    result = Relay().drain()
    message.refresh_from_db()
    assert (result.claimed, result.retried, result.failed) == (1, 0, 0)
    assert (message.state, message.attempts) == (OutboxState.SHOULD_BE_SENT, 0)
    assert message.last_error.startswith("destination unreachable (attempt not counted)")
    assert circuits.state("default") is CircuitState.OPEN
    assert OutboxMessage.objects.filter(state=OutboxState.SEND_ERROR).count() == 1
