"""Crash recovery in seconds: the rows of a dead relay come back within the recovery window
(heartbeats, default settings), a slow relay keeps its rows, a frozen one loses them and,
resumed, overwrites nothing."""

import json
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

import django_outbox
from django_outbox.conf import get_settings
from django_outbox.models import OutboxMessage, OutboxState, Worker
from tests.acceptance.helpers import kombu_ids_in_redis, stop, wait_for
from tests.conftest import spawn_manage, subprocess_env

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.row_locks,
    pytest.mark.redis,
    pytest.mark.processes,
]

#: The promise: a dead relay's rows are published again within this many seconds.
RECOVERY_WINDOW = 5.0
MESSAGES = 20


@pytest.fixture
def relays(configure_outbox, redis_url, queue_name, tmp_path: Path):
    """``start(blocking_seconds=None)`` runs an outbox_relay; a blocking one holds its
    first batch for that long before publishing (and writes the batch's ids to a file)."""
    settings = configure_outbox(
        DESTINATIONS={"default": {"TRANSPORT": "kombu", "URL": redis_url, "QUEUE": queue_name}}
    )
    # Default engine settings: LEASE_SECONDS 60, HEARTBEAT_SECONDS 1, WORKER_TIMEOUT_SECONDS 3.
    for key in ("LEASE_SECONDS", "HEARTBEAT_SECONDS", "WORKER_TIMEOUT_SECONDS"):
        assert key not in settings
    processes = []

    def start(blocking_seconds=None):
        outbox = json.loads(json.dumps(settings))
        marker = tmp_path / f"batch-{len(processes)}"
        if blocking_seconds is not None:
            outbox["OUTBOX"]["DESTINATIONS"]["default"].update(
                TRANSPORT="testproject.transports.BlockingKombuTransport",
                BLOCK_SECONDS=blocking_seconds,
                BLOCK_MARKER=str(marker),
            )
        env = subprocess_env(OUTBOX_SETTINGS_JSON=json.dumps(outbox))
        process = spawn_manage("outbox_relay", "--json", "--no-listen", env=env)
        processes.append(process)
        return process, marker

    yield start
    for process in processes:
        stop(process, signal.SIGKILL)


def held_batch(marker: Path) -> list[str]:
    return marker.read_text().split("\n") if marker.exists() else []


def at_broker(redis_url, queue_name) -> Counter:
    return Counter(kombu_ids_in_redis(redis_url, queue_name))


def live_workers(count: int) -> bool:
    return Worker.objects.count() >= count


def test_a_killed_relays_batch_is_published_by_another_within_seconds(
    relays, redis_url, queue_name
):
    for n in range(MESSAGES):
        django_outbox.send("order.created", {"n": n})
    doomed, marker = relays(blocking_seconds=3600)
    batch = wait_for(lambda: held_batch(marker), timeout=30, what="the first relay to claim")
    assert len(batch) == MESSAGES
    relays()
    wait_for(lambda: live_workers(2), timeout=30, what="the second relay's heartbeat")
    time.sleep(get_settings().worker_timeout_seconds + 1)  # it has been alive a whole timeout
    assert at_broker(redis_url, queue_name) == Counter(), "the live holder's rows were taken"

    killed = time.monotonic()
    doomed.send_signal(signal.SIGKILL)
    wait_for(
        lambda: set(at_broker(redis_url, queue_name)) == set(batch),
        timeout=30,
        what="the surviving relay to publish the dead relay's batch",
        interval=0.02,
    )
    recovery = time.monotonic() - killed
    print(f"\nSIGKILL → the dead relay's {len(batch)} rows published again: {recovery:.2f} s")
    assert recovery < RECOVERY_WINDOW
    # Published, then recorded: the record may still be on its way.
    wait_for(
        lambda: set(OutboxMessage.objects.values_list("state", flat=True)) == {OutboxState.SENT},
        timeout=10,
        what="the surviving relay to record the batch as sent",
    )
    assert max(at_broker(redis_url, queue_name).values()) == 1
    assert all(
        "its worker stopped" in e
        for e in OutboxMessage.objects.values_list("last_error", flat=True)
    )


def test_a_slow_relay_keeps_its_rows(relays, redis_url, queue_name):
    for n in range(MESSAGES):
        django_outbox.send("order.created", {"n": n})
    slow, marker = relays(blocking_seconds=30)
    batch = wait_for(lambda: held_batch(marker), timeout=30, what="the slow relay to claim")
    relays()
    wait_for(lambda: live_workers(2), timeout=30, what="the second relay's heartbeat")
    # Far longer than the recovery window: the slow relay still beats, so it keeps its rows.
    wait_for(
        lambda: at_broker(redis_url, queue_name),
        timeout=60,
        what="the slow relay to publish after its 30 s block",
    )
    wait_for(
        lambda: OutboxMessage.objects.filter(state=OutboxState.SENT).count() == MESSAGES,
        timeout=30,
        what="the slow relay to record its batch",
    )
    published = at_broker(redis_url, queue_name)
    assert set(published) == set(batch) and max(published.values()) == 1
    output = stop(slow, signal.SIGTERM)
    assert json.loads(output.strip().splitlines()[-1])["sent"] == MESSAGES


def test_a_frozen_relay_loses_its_rows_and_once_resumed_overwrites_nothing(
    relays, redis_url, queue_name
):
    for n in range(MESSAGES):
        django_outbox.send("order.created", {"n": n})
    frozen, marker = relays(blocking_seconds=2)
    batch = wait_for(lambda: held_batch(marker), timeout=30, what="the relay to claim")
    frozen.send_signal(signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        relays()
        wait_for(
            lambda: OutboxMessage.objects.filter(state=OutboxState.SENT).count() == MESSAGES,
            timeout=30,
            what="the other relay to take over the frozen relay's rows",
        )
        taken_over = time.monotonic() - stopped
        after_takeover = {
            m.pk: (m.sent_at, m.lock_token, m.attempts) for m in OutboxMessage.objects.all()
        }
    finally:
        frozen.send_signal(signal.SIGCONT)
    print(f"\nSIGSTOP → rows of the frozen relay sent by the other: {taken_over:.2f} s")
    # Resumed, it publishes the batch it held (at-least-once: duplicates at the broker)...
    wait_for(
        lambda: sum(at_broker(redis_url, queue_name).values()) >= 2 * MESSAGES,
        timeout=30,
        what="the resumed relay to finish its stale batch",
    )
    output = stop(frozen, signal.SIGTERM)
    totals = json.loads(output.strip().splitlines()[-1])
    # ... but every outcome it tries to record is fenced out: the newer one stands.
    assert (totals["sent"], totals["fenced"]) == (0, MESSAGES)
    assert {
        m.pk: (m.sent_at, m.lock_token, m.attempts) for m in OutboxMessage.objects.all()
    } == after_takeover
    assert set(at_broker(redis_url, queue_name)) == set(batch)
