"""outbox_relay wakes on PostgreSQL NOTIFY at commit, long before its poll interval."""

import signal
import time

import pytest
from django.db import connection, transaction

import django_outbox
from django_outbox.models import OutboxMessage, OutboxState
from tests.acceptance.helpers import stop, wait_for
from tests.conftest import spawn_manage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.processes]


def sent(message):
    return OutboxMessage.objects.filter(pk=message.pk, state=OutboxState.SENT).exists()


def test_relay_wakes_on_notify_and_stops_cleanly_on_sigterm(configure_outbox):
    configure_outbox(DISPATCH="notify")
    first = django_outbox.send("warm-up", {})
    relay = spawn_manage("outbox_relay", "--json", "--interval", "60")
    try:
        wait_for(lambda: sent(first), timeout=30, what="the relay to start and drain")
        time.sleep(0.5)  # it is now waiting on LISTEN, next poll in a minute
        with transaction.atomic():
            second = django_outbox.send("order.created", {"id": 2})
        committed = time.monotonic()
        wait_for(lambda: sent(second), timeout=10, what="NOTIFY to wake the relay")
        assert time.monotonic() - committed < 10
    finally:
        output = stop(relay, signal.SIGTERM)
    assert relay.returncode == 0, output
    assert '"sent": 2' in output


def test_relay_outlives_its_listen_connection(configure_outbox):
    configure_outbox(DISPATCH="notify")
    first = django_outbox.send("warm-up", {})
    relay = spawn_manage("outbox_relay", "--interval", "1")
    try:
        wait_for(lambda: sent(first), timeout=30, what="the relay to start and drain")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE query LIKE 'LISTEN%%' AND pid <> pg_backend_pid() "
                "AND datname = current_database()"
            )
            assert cursor.fetchall(), "no LISTEN connection found"
        second = django_outbox.send("order.created", {"id": 2})
        wait_for(lambda: sent(second), timeout=15, what="the relay to carry on after the drop")
        assert relay.poll() is None, "the relay exited"
    finally:
        output = stop(relay, signal.SIGTERM)
    assert relay.returncode == 0, output
    assert "LISTEN connection lost" in output
