"""A real Celery worker delivers on commit to RabbitMQ and Redis; a rollback sends nothing."""

import subprocess
import sys

import pytest
from django.conf import settings
from django.db import transaction
from kombu import Connection

import django_outbox
from django_outbox.models import OutboxMessage, OutboxState
from tests.acceptance.helpers import stop, wait_for
from tests.conftest import ROOT, subprocess_env
from tests.integration.test_kombu_transport import HEADERS, drain_queue

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.row_locks,
    pytest.mark.redis,
    pytest.mark.rabbitmq,
    pytest.mark.processes,
]


@pytest.fixture
def start_worker():
    """Start a Celery worker that reads the test's current DJANGO_OUTBOX."""
    processes = []

    def start(queue):
        command = [
            *(sys.executable, "-m", "celery", "-A", "testproject", "worker", "--pool=solo"),
            *("-Q", queue),
            *("--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "WARNING"),
        ]
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        processes.append(process)
        return process

    yield start
    for process in processes:
        stop(process)


@pytest.fixture
def route_outbox_tasks(monkeypatch):
    """Route the django_outbox.* tasks to a queue, as a project does with task_routes."""
    from celery import current_app
    from celery.app.routes import Router, prepare

    app = current_app._get_current_object()

    def route(queue):
        routes = prepare({"django_outbox.*": {"queue": queue}})
        router = Router(routes, app.amqp.queues, create_missing=True, app=app)
        monkeypatch.setattr(app.amqp, "router", router)

    return route


def test_worker_delivers_committed_messages_and_nothing_rolled_back(
    configure_outbox, amqp_url, redis_url, queue_name, start_worker, route_outbox_tasks
):
    configure_outbox(
        DESTINATIONS={
            "rabbit": {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": queue_name},
            "redis": {"TRANSPORT": "kombu", "URL": redis_url, "QUEUE": queue_name},
        },
        DISPATCH="celery",
    )
    # A queue of its own: stale triggers from other runs cannot delay this one.
    route_outbox_tasks(queue_name)
    start_worker(queue_name)
    with Connection(amqp_url) as connection:
        connection.SimpleQueue(queue_name).close()

    with pytest.raises(RuntimeError), transaction.atomic():
        django_outbox.send("order.created", {"order_id": 1}, to="rabbit")
        django_outbox.send("order.created", {"order_id": 1}, to="redis")
        raise RuntimeError("rolled back")
    with transaction.atomic():
        to_rabbit = django_outbox.send("order.created", {"order_id": 2}, to="rabbit", key="o:2")
        to_redis = django_outbox.send("order.created", {"order_id": 2}, to="redis", key="o:2")

    wait_for(
        lambda: OutboxMessage.objects.filter(state=OutboxState.SENT).count() == 2,
        timeout=60,
        what=f"the Celery worker (broker {settings.CELERY_BROKER_URL}) to deliver",
    )
    for url, message in ((amqp_url, to_rabbit), (redis_url, to_redis)):
        [received] = drain_queue(url, queue_name)
        assert received.payload == {"order_id": 2}
        assert set(HEADERS) <= set(received.headers)
        assert received.headers["outbox-message-id"] == str(message.message_id)
    assert OutboxMessage.objects.count() == 2
    with Connection(amqp_url) as connection:
        connection.default_channel.queue_delete(queue_name)
