"""Celery triggers keep their broker connections. Each test reaches a real broker (Redis,
RabbitMQ) through a proxy of its own, which counts the connections it accepts and can
close them all, as a broker restart would."""

import os
import threading

import pytest
import redis
from celery import Celery

from django_outbox.engine import triggers
from tests import services
from tests.proxy import TcpProxy

pytestmark = pytest.mark.django_db

TRIGGERS = 20


class Probe:
    """A part named ``probe`` whose trigger task lives on a Celery app of its own, whose
    broker is reached through *proxy*, and whose messages go to queue *queue*."""

    def __init__(self, broker: str, proxy: TcpProxy, queue: str, redis_url: str) -> None:
        self.broker, self.proxy, self.queue, self.redis_url = broker, proxy, queue, redis_url
        if broker == "redis":
            url = f"redis://127.0.0.1:{proxy.port}/{redis_url.rsplit('/', 1)[1]}"
        else:
            url = f"amqp://guest:guest@127.0.0.1:{proxy.port}//"
        self.app = Celery("trigger-probe", set_as_current=False)
        # Triggers go out on the app's write connection. The environment's
        # CELERY_BROKER_URL wins over ``broker_url``, not over ``broker_write_url``.
        self.app.conf.broker_write_url = url
        self.app.conf.task_default_queue = queue
        # As the docs ask for RabbitMQ: a publish returns once the broker has the message.
        self.app.conf.broker_transport_options = {"confirm_publish": broker == "rabbitmq"}

        @self.app.task(name="tests.trigger_probe")
        def task(ids, using="default"):  # pragma: no cover - never run, only published
            return ids

        self.task = task

    def queued(self) -> int:
        if self.broker == "redis":
            return redis.Redis.from_url(self.redis_url).llen(self.queue)
        from kombu import Connection

        with Connection(services.AMQP_URL, connect_timeout=2) as connection:
            _, count, _ = connection.default_channel.queue_declare(self.queue, passive=True)
            return count


@pytest.fixture(params=["redis", "rabbitmq"])
def probe(request, redis_url, monkeypatch, configure_outbox):
    broker = request.param
    services.require(broker)
    configure_outbox(DISPATCH="celery")
    # Each pytest-xdist worker its own queue: they share one RabbitMQ.
    queue = f"trigger-probe-{broker}-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    if broker == "rabbitmq":
        services.delete_rabbitmq_queue(queue)
    proxy = TcpProxy(services.SERVICES[broker])
    proxy.up()
    made = Probe(broker, proxy, queue, redis_url)
    monkeypatch.setitem(triggers.TASKS, "probe", f"{__name__}.PROBE_TASK")
    monkeypatch.setitem(globals(), "PROBE_TASK", made.task)
    yield made
    triggers._connections.close()
    proxy.down()
    if broker == "rabbitmq":
        services.delete_rabbitmq_queue(queue)


def test_triggers_of_one_process_share_one_broker_connection(probe):
    triggers._send_celery("probe", "default", [0])  # the first connects
    before = probe.proxy.accepted
    for n in range(1, TRIGGERS + 1):
        triggers._send_celery("probe", "default", [n])
    assert probe.queued() == TRIGGERS + 1
    # Before the pool had a limit, kombu closed each connection when it was released:
    # every trigger connected anew (two connections each to Redis).
    assert probe.proxy.accepted == before


def test_an_app_without_a_pool_connects_for_each_trigger(probe):
    """``broker_pool_limit = None`` turns Celery's pool off; ours follows the app."""
    probe.app.conf.broker_pool_limit = None
    for n in range(TRIGGERS):
        triggers._send_celery("probe", "default", [n])
    assert probe.queued() == TRIGGERS
    assert probe.proxy.accepted >= TRIGGERS


def test_a_trigger_never_waits_for_a_kept_connection(probe):
    """With every kept connection in use (here the only one, held by this thread, as a
    task run eagerly holds it while it triggers again), a trigger gets one of its own at
    once instead of waiting for one that would never come back."""
    probe.app.conf.broker_pool_limit = 1
    done = threading.Event()

    def nested() -> None:
        with triggers._connections.connection(probe.app):
            triggers._send_celery("probe", "default", [1])
        triggers._send_celery("probe", "default", [2])  # the kept one again
        done.set()

    thread = threading.Thread(target=nested, daemon=True)
    thread.start()
    assert done.wait(30), "a trigger waited for a connection its own thread holds"
    assert probe.queued() == 2


def test_a_trigger_after_the_broker_dropped_the_kept_connection_still_arrives(probe, caplog):
    """A kept connection goes stale when the broker restarts or drops it: the next
    trigger connects again and is published, rather than being logged and lost until
    the sweep."""
    triggers._send_celery("probe", "default", [1])
    probe.proxy.down()  # the broker "restarts": the kept connection is dead
    probe.proxy.up()
    triggers.dispatch_now("probe", "default", [2])
    assert probe.queued() == 2
    if probe.broker == "rabbitmq":
        # py-amqp sees the dead socket on the publish (redis-py reconnects by itself).
        assert "the broker connection of probe triggers broke" in caplog.text


def test_an_error_that_is_not_the_connection_is_not_sent_again(probe, monkeypatch):
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise TypeError("not a connection problem")

    monkeypatch.setattr(probe.task, "apply_async", refuse)
    with pytest.raises(TypeError):
        triggers._send_celery("probe", "default", [1])
    assert len(calls) == 1
