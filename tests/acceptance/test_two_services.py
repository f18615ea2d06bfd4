"""Two services, each with its own database, over RabbitMQ: A sends a request through its
outbox to B's queue; B's inbox handles it and replies through B's outbox; A's inbox
matches the reply to its request. B runs as real processes on a database of its own."""

import json
import uuid

import psycopg
import pytest
from django.core.management import call_command
from kombu import Connection

import django_outbox
from django_outbox.inbox.handling import Inbox
from django_outbox.models import InboxMessage, InboxState, OutboxMessage
from django_outbox.outbox.relay import Relay
from testproject.shop.models import Payment
from tests import services
from tests.conftest import spawn_manage, subprocess_env
from tests.conftest import test_database_url as current_database_url

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.rabbitmq,
    pytest.mark.processes,
]


@pytest.fixture
def service_b():
    """B's database: created, migrated by B's own process, dropped afterwards."""
    name = f"django_outbox_b_{uuid.uuid4().hex[:8]}"
    base = current_database_url().rsplit("/", 1)[0]
    with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{base}/{name}"
    try:
        yield url
    finally:
        with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def queues():
    names = [f"svc-{side}-{uuid.uuid4().hex[:8]}" for side in ("a", "b")]
    with Connection(services.AMQP_URL) as connection:
        for name in names:
            connection.SimpleQueue(name).close()
    yield names
    for name in names:
        services.delete_rabbitmq_queue(name)


def run_b(url, settings, *args):
    env = subprocess_env(DATABASE_URL=url, OUTBOX_SETTINGS_JSON=json.dumps(settings))
    process = spawn_manage(*args, env=env)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    return output


def test_a_request_and_its_reply_between_two_services(
    configure_outbox, amqp_url, service_b, queues
):
    a_in, b_in = queues
    configure_outbox(  # service A: this test's database
        DESTINATIONS={"b": {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": b_in}},
        INBOX={"SOURCES": {"b": {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": a_in}}},
    )
    settings_b = {
        "DISPATCH": "none",
        "OUTBOX": {"DESTINATIONS": {"a": {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": a_in}}},
        "INBOX": {
            "SOURCES": {
                "a": {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": b_in, "REPLY_TO": "a"}
            }
        },
    }
    run_b(service_b, settings_b, "migrate", "-v0")

    request = django_outbox.send("quote.requested", {"order": "o9"}, to="b", reply_to="b")
    assert Relay().drain().sent == 1  # A → RabbitMQ
    run_b(service_b, settings_b, "inbox_consume", "a", "--until-idle", "1")  # B handles
    run_b(service_b, settings_b, "outbox_relay", "--until-empty", "--no-listen")  # B replies
    call_command("inbox_consume", "b", "--until-idle", "1")  # A receives the reply
    Inbox().drain()

    reply = InboxMessage.objects.get(source="b")
    assert reply.type == "quote.requested.reply"
    assert (reply.correlation_id, reply.state) == (request.correlation_id, InboxState.HANDLED)
    assert reply.payload == {"order": "o9", "price_cents": 4200}
    assert Payment.objects.get().status == "quoted"
    # B's own database holds the request it handled and the reply it sent.
    with psycopg.connect(service_b) as b:
        handled = b.execute(
            "SELECT type, state, correlation_id FROM django_outbox_inbox"
        ).fetchall()
        sent = b.execute("SELECT type, state, correlation_id FROM django_outbox_message").fetchall()
    assert handled == [("quote.requested", "handled", request.correlation_id)]
    assert sent == [("quote.requested.reply", "sent", request.correlation_id)]
    # A's own database: its request, and no trace of B's rows.
    assert list(OutboxMessage.objects.values_list("type", flat=True)) == ["quote.requested"]
