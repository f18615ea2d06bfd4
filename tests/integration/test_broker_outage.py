"""Broker down: its messages wait for it; when it returns, all are delivered.

With the circuit breaker (the default) they wait for the destination's circuit,
uncounted, and go as soon as a probe finds the broker back; without it, each
message waits out its own growing backoff.
"""

import logging
import time
from datetime import timedelta

import pytest
from django.utils import timezone

import django_outbox
from django_outbox.models import OutboxMessage, OutboxState
from django_outbox.outbox.circuits import CircuitState, circuits
from django_outbox.outbox.maintenance import sweep
from django_outbox.outbox.relay import Relay
from tests.integration.test_kombu_transport import drain_queue
from tests.proxy import TcpProxy

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["redis", "rabbitmq"])
def proxied_broker(request, configure_outbox, queue_name):
    if request.param == "redis":
        real_url = request.getfixturevalue("redis_url")
        proxy = TcpProxy(("127.0.0.1", 6379))
        url = real_url.replace("127.0.0.1:6379", f"127.0.0.1:{proxy.port}")
    else:
        real_url = request.getfixturevalue("amqp_url")
        proxy = TcpProxy(("127.0.0.1", 5672))
        url = real_url.replace("127.0.0.1:5672", f"127.0.0.1:{proxy.port}")
    configure_outbox(
        DESTINATIONS={
            "default": {"TRANSPORT": "kombu", "URL": url, "QUEUE": queue_name, "TIMEOUT": 2}
        },
        MAX_ATTEMPTS=50,
    )
    yield proxy, real_url, queue_name
    proxy.down()


def test_outage_opens_the_circuit_and_everything_goes_once_the_broker_returns(
    proxied_broker, caplog
):
    proxy, real_url, queue = proxied_broker
    caplog.set_level(logging.INFO, "django_outbox")
    ids = {str(django_outbox.send("order.created", {"n": n}).message_id) for n in range(30)}
    result = Relay().drain()
    assert (result.claimed, result.retried, result.sent) == (30, 0, 0)
    rows = list(OutboxMessage.objects.all())
    assert {(r.state, r.attempts) for r in rows} == {(OutboxState.SHOULD_BE_SENT, 0)}
    assert all(r.last_error.startswith("destination unreachable") for r in rows)
    assert circuits.state("default") is CircuitState.OPEN
    assert "destination 'default' is unreachable: circuit open" in caplog.text
    # While the circuit is open the relay leaves the destination's rows alone.
    assert Relay().drain().claimed == 0

    proxy.up()
    time.sleep(0.3)  # the first probe is due CIRCUIT_PROBE_SECONDS (0.25 s) after opening
    result = Relay().drain()
    assert (result.sent, result.retried) == (30, 0)
    assert circuits.state("default") is CircuitState.CLOSED
    assert "circuit closed" in caplog.text
    received = drain_queue(real_url, queue)
    assert {m.headers["outbox-message-id"] for m in received} == ids
    assert len(received) == 30


def test_without_the_breaker_the_outage_backs_off_each_message(
    proxied_broker, caplog, configure_outbox, settings
):
    settings.DJANGO_OUTBOX["OUTBOX"]["CIRCUIT_BREAKER"] = False
    settings.DJANGO_OUTBOX = dict(settings.DJANGO_OUTBOX)
    proxy, real_url, queue = proxied_broker
    ids = {str(django_outbox.send("order.created", {"n": n}).message_id) for n in range(30)}
    now = timezone.now()
    delays = []
    for attempt in range(1, 4):
        result = Relay(clock=lambda: now).drain()
        assert (result.claimed, result.retried, result.sent) == (30, 30, 0)
        rows = list(OutboxMessage.objects.all())
        assert {r.state for r in rows} == {OutboxState.SHOULD_BE_SENT}
        assert {r.attempts for r in rows} == {attempt}
        assert all("Error" in r.last_error or "refused" in r.last_error for r in rows)
        earliest = min(r.available_at for r in rows)
        delays.append((earliest - now).total_seconds())
        now = max(r.available_at for r in rows)
    assert delays[0] < delays[1] < delays[2]  # exponential: within [0.5-1], [1-2], [2-4] s
    assert "publish to" in caplog.text  # the outage is logged …
    assert "guest:guest" not in caplog.text  # … without the broker password

    proxy.up()
    counts = sweep(now=now + timedelta(seconds=1))
    assert counts["sent"] == 30
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {OutboxState.SENT}
    received = drain_queue(real_url, queue)
    assert {m.headers["outbox-message-id"] for m in received} == ids
    assert len(received) == 30
