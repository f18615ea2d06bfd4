"""Chaos, reduced: relays SIGKILLed every few seconds while they post to a 50 ms HTTP
endpoint, and while they post batches to the inbox's webhook view, and a relay whose
database connection is killed between publish and record.

``make chaos`` runs the same tests at full size (CHAOS_MESSAGES, CHAOS_KILLS).
"""

import itertools
import json
import os
import signal
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.db import connection

import django_outbox
from django_outbox.models import OutboxMessage, OutboxState
from tests.acceptance.helpers import stop, wait_for
from tests.acceptance.test_recovery import RECOVERY_WINDOW
from tests.conftest import spawn_manage, subprocess_env

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.row_locks,
    pytest.mark.processes,
]

MESSAGES = int(os.environ.get("CHAOS_MESSAGES", "2000"))
KILLS = int(os.environ.get("CHAOS_KILLS", "4"))
KILL_EVERY = 4.0  # seconds; longer than WORKER_TIMEOUT_SECONDS, so a survivor may rescue


class Endpoint(BaseHTTPRequestHandler):
    """Answers 200 after 50 ms; records (arrival time, message id)."""

    arrivals: list = []

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(0.05)
        Endpoint.arrivals.append((time.monotonic(), self.headers["Idempotency-Key"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint():
    Endpoint.arrivals = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/hook"
    httpd.shutdown()
    httpd.server_close()


def sent_while_relays_are_killed(*, every: float, stagger: float) -> int:
    """Two relays (the second *stagger* seconds after the first) until every message is
    sent; every *every* seconds, up to ``KILLS`` times while some are not, the older one
    SIGKILLed and a new one started. Returns how many were killed."""

    def start():
        return spawn_manage("outbox_relay", "--json", "--no-listen", "--interval", "0.2")

    relays = [start()]
    time.sleep(stagger)
    relays.append(start())
    kills = 0
    try:
        while kills < KILLS and OutboxMessage.objects.exclude(state=OutboxState.SENT).exists():
            time.sleep(every)
            stop(relays.pop(0), signal.SIGKILL)
            kills += 1
            relays.append(start())
        wait_for(
            lambda: not OutboxMessage.objects.exclude(state=OutboxState.SENT).exists(),
            timeout=120,
            what="every message to be sent",
        )
    finally:
        for relay in relays:
            stop(relay, signal.SIGKILL)
    return kills


def test_http_delivery_keeps_flowing_while_relays_are_killed(configure_outbox, endpoint):
    configure_outbox(DESTINATIONS={"default": {"TRANSPORT": "http", "URL": endpoint}})
    OutboxMessage.objects.bulk_create(
        OutboxMessage(type="order.created", destination="default", payload={"n": n})
        for n in range(MESSAGES)
    )
    expected = {str(m) for m in OutboxMessage.objects.values_list("message_id", flat=True)}

    kills = sent_while_relays_are_killed(every=KILL_EVERY, stagger=KILL_EVERY / 2)

    times = sorted(t for t, _ in Endpoint.arrivals)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    received = Counter(key for _, key in Endpoint.arrivals)
    print(
        f"\n{MESSAGES} messages, {kills} relays SIGKILLed: longest silence {max(gaps):.2f} s, "
        f"{sum(received.values()) - len(received)} duplicate deliveries, "
        f"{times[-1] - times[0]:.1f} s in all"
    )
    assert set(received) == expected
    assert kills >= 1, "everything was sent before the first kill: raise CHAOS_MESSAGES"
    assert max(gaps) < RECOVERY_WINDOW


def test_webhook_batches_lose_nothing_and_keep_key_order_while_relays_are_killed(
    configure_outbox, live_server, monkeypatch
):
    """The ``http`` transport's ``BATCH`` to the inbox's own webhook view (served in this
    process), relays SIGKILLed mid-batch: every message is stored once in the inbox, and
    the messages of each key were first stored in their order. A resent batch's messages
    are duplicates (stored before the kill, not recorded as sent)."""
    from django_outbox.inbox.consumers import webhook
    from django_outbox.models import InboxMessage

    real = webhook._store_batch

    def slow(*args, **kwargs):  # a receiver at 20 ms a batch: kills land mid-request
        time.sleep(0.02)
        return real(*args, **kwargs)

    monkeypatch.setattr(webhook, "_store_batch", slow)
    secret = "chaos-batch"
    configure_outbox(
        DESTINATIONS={
            "default": {
                "TRANSPORT": "http",
                "URL": f"{live_server.url}/inbox/shop/",
                "SECRET": secret,
                "BATCH": 20,
                "CONCURRENCY": 2,
            }
        },
        INBOX={"SOURCES": {"shop": {"TRANSPORT": "webhook", "SECRET": secret}}},
    )
    keys = [f"order:{k}" for k in range(20)]
    for n in range(MESSAGES):
        django_outbox.send("order.created", {"n": n}, key=keys[n % len(keys)])
    expected = {str(m) for m in OutboxMessage.objects.values_list("message_id", flat=True)}

    kills = sent_while_relays_are_killed(every=KILL_EVERY / 4, stagger=0)
    stored = list(InboxMessage.objects.order_by("id").values_list("message_id", "key", "sequence"))
    attempts = sum(OutboxMessage.objects.values_list("attempts", flat=True))
    print(
        f"\n{MESSAGES} messages in batches of 20, {kills} relays SIGKILLed: "
        f"{attempts - MESSAGES} deliveries beyond one a message (resent after a kill)"
    )
    assert kills >= 1, "everything was sent before the first kill: raise CHAOS_MESSAGES"
    assert len(stored) == len(expected)
    assert {message_id for message_id, _, _ in stored} == expected
    for key in keys:
        sequences = [sequence for _, k, sequence in stored if k == key]
        assert sequences == sorted(sequences), f"{key} stored out of order: {sequences}"


def other_connections_killed() -> int:
    """Kill every other session on the test database (a failover, a proxy restart)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return int(cursor.fetchone()[0])
        cursor.execute(
            "SELECT id FROM information_schema.processlist WHERE db = DATABASE() "
            "AND id <> CONNECTION_ID()"
        )
        ids = [row[0] for row in cursor.fetchall()]
        for session in ids:
            cursor.execute(f"KILL CONNECTION {int(session)}")
        return len(ids)


@pytest.mark.redis
def test_a_relay_whose_connection_dies_mid_batch_records_on_a_new_one(
    configure_outbox, redis_url, queue_name, tmp_path: Path
):
    settings = configure_outbox(
        DESTINATIONS={
            "default": {
                "TRANSPORT": "testproject.transports.BlockingKombuTransport",
                "URL": redis_url,
                "QUEUE": queue_name,
                "BLOCK_SECONDS": 2,
                "BLOCK_MARKER": str(tmp_path / "batch"),
            }
        }
    )
    messages = [django_outbox.send("order.created", {"n": n}, key="k") for n in range(10)]
    relay = spawn_manage(
        "outbox_relay",
        "--json",
        "--no-listen",
        env=subprocess_env(OUTBOX_SETTINGS_JSON=json.dumps(settings)),
    )
    try:
        wait_for((tmp_path / "batch").exists, timeout=30, what="the relay to hold its batch")
        assert other_connections_killed() >= 1  # while it publishes
        started = time.monotonic()
        wait_for(
            lambda: OutboxMessage.objects.filter(state=OutboxState.SENT).count() == 10,
            timeout=30,
            what="the outcomes to be recorded on a new connection",
        )
        recorded_after = time.monotonic() - started
    finally:
        output = stop(relay, signal.SIGTERM)
    totals = json.loads(output.strip().splitlines()[-1])
    print(f"\nconnection killed mid-batch: outcomes recorded {recorded_after:.2f} s later")
    assert (totals["sent"], totals["fenced"]) == (10, 0), output
    assert recorded_after < 10  # the block, not the 60 s lease
    rows = OutboxMessage.objects.filter(pk__in=[m.pk for m in messages])
    assert {(m.state, m.attempts) for m in rows} == {(OutboxState.SENT, 1)}
    # Recovered on a new connection within the retries: nothing for anyone to act on.
    assert " ERROR " not in output, output
