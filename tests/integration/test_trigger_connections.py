"""Celery triggers keep their broker connection: a real Redis broker counts the
connections it accepts while one process publishes many triggers, and a kept connection
the broker dropped (through a proxy that closes it) is replaced, the trigger not lost."""

import pytest
import redis
from celery import Celery

from django_outbox.engine import triggers
from tests import services
from tests.proxy import TcpProxy

pytestmark = pytest.mark.django_db

TRIGGERS = 20


def probe_part(monkeypatch, broker_url: str, queue: str) -> Celery:
    """Register a part named ``probe`` whose trigger task lives on a Celery app of its own,
    with *broker_url* as its broker and *queue* as its queue; return the app."""
    # Celery reads the variable before its configuration: it would win over ``broker``.
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    app = Celery("trigger-probe", broker=broker_url, set_as_current=False)
    app.conf.task_default_queue = queue

    @app.task(name="tests.trigger_probe")
    def task(ids, using="default"):  # pragma: no cover - never run, only published
        return ids

    monkeypatch.setitem(triggers.TASKS, "probe", f"{__name__}.PROBE_TASK")
    monkeypatch.setitem(globals(), "PROBE_TASK", task)
    return app


@pytest.fixture
def probe(redis_url, monkeypatch):
    """The ``probe`` part, with the test Redis database as its broker."""
    yield probe_part(monkeypatch, redis_url, "trigger-probe")
    triggers._connections.close()


def accepted(client: redis.Redis) -> int:
    return int(client.info("stats")["total_connections_received"])


def test_triggers_of_one_process_share_one_broker_connection(configure_outbox, probe, redis_url):
    configure_outbox(DISPATCH="celery")
    client = redis.Redis.from_url(redis_url)
    triggers._send_celery("probe", "default", [0])  # the first connects
    before = accepted(client)
    for n in range(1, TRIGGERS + 1):
        triggers._send_celery("probe", "default", [n])
    opened = accepted(client) - before
    # Every trigger reached the broker...
    assert client.llen("trigger-probe") == TRIGGERS + 1
    # ...over the connection the first one opened. Before the pool had a limit, kombu
    # closed each connection on release: every trigger connected anew (about four
    # connections each). The margin is for other test processes using this server.
    assert opened < TRIGGERS // 2, f"{opened} connections for {TRIGGERS} triggers"


def test_an_app_without_a_pool_connects_for_each_trigger(configure_outbox, probe, redis_url):
    """``broker_pool_limit = None`` turns Celery's pool off; ours follows the app."""
    configure_outbox(DISPATCH="celery")
    probe.conf.broker_pool_limit = None
    client = redis.Redis.from_url(redis_url)
    before = accepted(client)
    for n in range(TRIGGERS):
        triggers._send_celery("probe", "default", [n])
    assert client.llen("trigger-probe") == TRIGGERS
    assert accepted(client) - before >= TRIGGERS


def queued_on_rabbitmq(queue: str) -> int:
    from kombu import Connection

    with Connection(services.AMQP_URL, connect_timeout=2) as connection:
        _, count, _ = connection.default_channel.queue_declare(queue, passive=True)
        return count


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_a_trigger_after_the_broker_dropped_the_kept_connection_still_arrives(
    configure_outbox, monkeypatch, redis_url, broker
):
    """A kept connection goes stale when the broker restarts or drops it: the next
    trigger connects again and is published, rather than being logged and lost until
    the sweep. The broker is reached through a proxy that closes every connection."""
    services.require(broker)
    configure_outbox(DISPATCH="celery")
    queue = f"trigger-probe-{broker}"
    proxy = TcpProxy(services.SERVICES[broker])
    proxy.up()
    if broker == "redis":
        url = f"redis://127.0.0.1:{proxy.port}/{redis_url.rsplit('/', 1)[1]}"
    else:
        url = f"amqp://guest:guest@127.0.0.1:{proxy.port}//"
        services.delete_rabbitmq_queue(queue)
    probe_part(monkeypatch, url, queue)
    try:
        triggers._send_celery("probe", "default", [1])
        proxy.down()  # the broker "restarts": the kept connection is dead
        proxy.up()
        triggers.dispatch_now("probe", "default", [2])
        if broker == "redis":
            assert redis.Redis.from_url(redis_url).llen(queue) == 2
        else:
            assert queued_on_rabbitmq(queue) == 2
    finally:
        triggers._connections.close()
        proxy.down()
        if broker == "rabbitmq":
            services.delete_rabbitmq_queue(queue)
