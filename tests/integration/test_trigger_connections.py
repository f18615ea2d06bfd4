"""Celery triggers keep their broker connection: a real Redis broker counts the
connections it accepts while one process publishes many triggers."""

import pytest
import redis
from celery import Celery

from django_outbox.engine import triggers

pytestmark = pytest.mark.django_db

TRIGGERS = 20


@pytest.fixture
def probe(redis_url, monkeypatch):
    """A part named ``probe`` whose trigger task lives on a Celery app of its own, with the
    test Redis database as its broker."""
    # Celery reads the variable before its configuration: it would win over ``broker``.
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    app = Celery("trigger-probe", broker=redis_url, set_as_current=False)
    app.conf.task_default_queue = "trigger-probe"

    @app.task(name="tests.trigger_probe")
    def task(ids, using="default"):  # pragma: no cover - never run, only published
        return ids

    monkeypatch.setitem(triggers.TASKS, "probe", f"{__name__}.PROBE_TASK")
    monkeypatch.setitem(globals(), "PROBE_TASK", task)
    yield app
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
