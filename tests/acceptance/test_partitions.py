"""Hosts cut off the network mid-flight (SPEC guarantees 1, 3, 5 and 6 across hosts).

Each test runs one process inside a host (a network namespace, ``tests.hosts``),
lets it take rows, then takes the host's link down: its packets vanish, nobody is
told. A process on this machine takes the rows over within the recovery window.
The link comes back and the cut-off process goes on from where it stood: whatever
it then writes is fenced out, and the rows' records do not change.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

import django_outbox
from django_outbox.conf import get_settings
from django_outbox.jobs.models import Job, JobState
from django_outbox.models import InboxMessage, OutboxMessage, OutboxState
from testproject.shop import jobs
from testproject.shop.models import Payment
from tests import hosts, services
from tests.acceptance.helpers import (
    finish,
    kombu_ids_in_redis,
    read_as_it_comes,
    wait_for,
    wait_for_workers,
)
from tests.conftest import ROOT, spawn_manage, subprocess_env

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.row_locks,
    pytest.mark.processes,
    pytest.mark.one_database,
    pytest.mark.netns,
]

#: How long a host stays cut off: longer than WORKER_TIMEOUT_SECONDS (3 s) and than
#: the servers' keepalive (about 11 s), so that both the rescue and the servers'
#: loss of the host's connections happen while it is away.
CUT_SECONDS = 13.0
#: The promise: rows of a host that vanished are taken over within this many seconds.
RECOVERY_WINDOW = 8.0


@pytest.fixture
def host():
    """``host(name)`` makes a host for this test; all are torn down after it."""
    reason = hosts.available()
    if reason is not None:
        if services.services_required():
            pytest.fail(f"CI must run the network-namespace tests: {reason}")
        pytest.skip(reason)
    made: list[hosts.Host] = []

    def make(name: str) -> hosts.Host:
        made.append(hosts.Host(name))
        return made[-1]

    yield make
    for each in made:
        each.close()


def manage_in(where: hosts.Host, *args: str, **env: str) -> Any:
    import sys

    process = where.spawn([sys.executable, str(ROOT / "manage.py"), *args], subprocess_env(**env))
    return read_as_it_comes(process)


@pytest.fixture
def witness():
    """``witness(*command)`` starts a worker process with nothing to do and returns once
    it beats. A death is declared only while another worker has been beating for a
    whole ``WORKER_TIMEOUT_SECONDS``; as in a deployment, that worker is up before a
    host vanishes, and the survivor's boot overlaps the timeout instead of adding to
    it."""
    started: list[Any] = []

    def start(*command: str) -> None:
        started.append(read_as_it_comes(spawn_manage(*command, env=subprocess_env())))
        wait_for_workers(1)

    yield start
    for process in started:
        try:
            finish(process, signal.SIGTERM)
        except subprocess.TimeoutExpired:
            finish(process, signal.SIGKILL)


def snapshot(model: Any, *fields: str) -> list[tuple[Any, ...]]:
    return list(model.objects.order_by("pk").values_list("pk", *fields))


def test_a_relay_cut_off_mid_batch_is_taken_over_and_its_late_writes_change_nothing(
    host, witness, configure_outbox, redis_url, queue_name, tmp_path: Path
):
    settings = configure_outbox(
        DESTINATIONS={"default": {"TRANSPORT": "kombu", "URL": redis_url, "QUEUE": queue_name}}
    )
    witness("jobs_worker", "--interval", "0.1")  # no jobs: it only beats
    ids = [str(django_outbox.send("order.created", {"n": n}).message_id) for n in range(20)]
    marker = tmp_path / "claimed"
    blocking = json.loads(json.dumps(settings))
    blocking["OUTBOX"]["DESTINATIONS"]["default"].update(
        TRANSPORT="testproject.transports.BlockingKombuTransport",
        BLOCK_SECONDS=4,  # wakes while cut off, publishes when it can
        BLOCK_MARKER=str(marker),
    )
    away = host("relay")
    doomed = manage_in(
        away, "outbox_relay", "--json", "--no-listen", OUTBOX_SETTINGS_JSON=json.dumps(blocking)
    )
    survivor = None
    try:
        wait_for(marker.exists, timeout=30, what="the cut-off relay to claim its batch")
        assert set(OutboxMessage.objects.values_list("state", flat=True)) == {OutboxState.SENDING}
        away.cut()
        cut_at = time.monotonic()
        survivor = read_as_it_comes(spawn_manage("outbox_relay", "--json", "--no-listen"))
        wait_for(
            lambda: not OutboxMessage.objects.exclude(state=OutboxState.SENT).exists(),
            timeout=30,
            what="the relay on this side to take the batch over",
            interval=0.05,
        )
        taken_over = time.monotonic() - cut_at
        settled = snapshot(OutboxMessage, "state", "lock_token", "attempts", "sent_at")
        time.sleep(max(0.0, CUT_SECONDS - (time.monotonic() - cut_at)))
        away.reconnect()
        # Back on the network, the cut-off relay finds itself declared dead.
        wait_for(
            lambda: "declared dead" in "".join(doomed.lines),
            timeout=60,
            what="the cut-off relay to come back and find its lease gone",
        )
        time.sleep(2 * get_settings().heartbeat_seconds + 1)  # whatever it does next, done
        assert snapshot(OutboxMessage, "state", "lock_token", "attempts", "sent_at") == settled
    finally:
        output = finish(doomed, signal.SIGKILL)
        if survivor is not None:
            finish(survivor, signal.SIGTERM)
    print(f"\nrelay cut off: its batch of {len(ids)} sent by another in {taken_over:.2f} s")
    assert taken_over < RECOVERY_WINDOW, output
    at_broker = Counter(kombu_ids_in_redis(redis_url, queue_name))
    assert set(at_broker) == set(ids)  # none lost
    # The cut-off relay asks the database before it publishes: no copy from it.
    assert max(at_broker.values()) == 1, (at_broker, output)


@pytest.mark.jobs
def test_a_job_worker_cut_off_mid_job_is_taken_over_and_its_late_record_is_fenced(
    host, witness, tmp_path: Path
):
    witness("outbox_relay", "--no-listen")  # no messages: it only beats
    marker = tmp_path / "started"
    result = jobs.slow.enqueue("cut-off-mid-job", 6, str(marker))  # wakes while cut off
    away = host("worker")
    doomed = manage_in(away, "jobs_worker", "--json", "--interval", "0.1")
    survivor = None
    try:
        wait_for(marker.exists, timeout=60, what="the job to start in the cut-off host")
        away.cut()
        cut_at = time.monotonic()
        survivor = read_as_it_comes(
            spawn_manage("jobs_worker", "--json", "--interval", "0.1", env=subprocess_env())
        )
        wait_for(
            lambda: Job.objects.filter(state=JobState.SUCCESSFUL).exists(),
            timeout=60,
            what="a worker on this side to run the job again",
            interval=0.05,
        )
        taken_over = time.monotonic() - cut_at
        settled = snapshot(Job, "state", "lock_token", "attempts", "finished_at", "errors")
        time.sleep(max(0.0, CUT_SECONDS - (time.monotonic() - cut_at)))
        away.reconnect()
        wait_for(
            lambda: "declared dead" in "".join(doomed.lines),
            timeout=60,
            what="the cut-off worker to come back and find its lease gone",
        )
        time.sleep(2 * get_settings().heartbeat_seconds + 1)
        assert snapshot(Job, "state", "lock_token", "attempts", "finished_at", "errors") == (
            settled
        )
    finally:
        output = finish(doomed, signal.SIGKILL)
        if survivor is not None:
            finish(survivor, signal.SIGTERM)
    print(f"\njob worker cut off: its job run again by another in {taken_over:.2f} s")
    assert taken_over < RECOVERY_WINDOW, output
    result.refresh()
    assert result.status == "SUCCESSFUL"
    assert [e.exception_class_path for e in result.errors] == ["django_outbox.jobs.WorkerLost"]
    # At least once: the survivor's run wrote its effect; the cut-off run's own write
    # failed with its connection (the servers dropped it while the host was away).
    effects = Payment.objects.filter(order_ref="cut-off-mid-job").count()
    print(f"job worker cut off: the job's effect written {effects} time(s)")
    assert effects >= 1


@pytest.mark.rabbitmq
def test_a_consumer_cut_off_mid_batch_is_taken_over_and_every_effect_happens_once(
    host, configure_outbox, amqp_url, queue_name
):
    configure_outbox(
        INBOX={"SOURCES": {"shop": {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": queue_name}}}
    )
    orders = [f"o{n}" for n in range(40)]
    with Connection(amqp_url) as connection:
        connection.SimpleQueue(queue_name).close()
        producer = connection.Producer()
        for number, order in enumerate(orders):
            producer.publish(
                {"order_id": order},
                routing_key=queue_name,
                serializer="json",
                headers={"outbox-message-id": f"m-{number}", "outbox-type": "invoice.requested"},
            )
    away = host("consumer")
    # A slow handler: the host is cut off with a batch stored and half handled, its
    # transaction open and its deliveries unacknowledged.
    doomed = manage_in(
        away, "inbox_consume", "--json", "--batch", "10", TESTPROJECT_HANDLER_DELAY="0.3"
    )
    survivor = None
    try:
        wait_for(
            lambda: any("handl" in line for line in doomed.lines) or Payment.objects.exists(),
            timeout=60,
            what="the cut-off consumer to connect",
        )
        time.sleep(1.0)  # inside its first batch's handlers
        away.cut()
        cut_at = time.monotonic()
        survivor = read_as_it_comes(
            spawn_manage("inbox_consume", "--json", "--batch", "10", env=subprocess_env())
        )
        wait_for(
            lambda: Payment.objects.count() >= len(orders),
            timeout=90,
            what="every order handled",
            interval=0.1,
        )
        taken_over = time.monotonic() - cut_at
        time.sleep(max(0.0, CUT_SECONDS - (time.monotonic() - cut_at)))
        away.reconnect()
        time.sleep(5)  # the cut-off consumer comes back and finds its connections gone
    finally:
        output = finish(doomed, signal.SIGKILL)
        if survivor is not None:
            finish(survivor, signal.SIGTERM)
    print(f"\nconsumer cut off: every order handled {taken_over:.2f} s after the cut")
    # Its unacknowledged deliveries come back when the broker drops its connection.
    assert taken_over < hosts.DEAD_AFTER + RECOVERY_WINDOW, output
    assert Counter(Payment.objects.values_list("order_ref", flat=True)) == Counter(orders), output
    assert InboxMessage.objects.count() == len(orders)


@pytest.mark.redis
def test_a_redis_consumer_cut_off_while_waiting_loses_nothing_redis_handed_it(
    host, configure_outbox, redis_url, queue_name
):
    """Cut off while it waits for a message (a blocking move pending in Redis), the
    consumer is handed the first message published: Redis moves it into the consumer's
    processing list and the answer vanishes with the link. With a plain ``BRPOP`` that
    message would be gone; here it waits in the list until the consumer's lease runs
    out, and the survivor moves it back."""
    configure_outbox(
        INBOX={
            "SOURCES": {
                "shop": {
                    "TRANSPORT": "kombu",
                    "URL": redis_url,
                    "QUEUE": queue_name,
                    "LEASE_SECONDS": 3.0,
                }
            }
        }
    )
    away = host("redis-consumer")
    doomed = manage_in(away, "inbox_consume", "--json", "--batch", "10")
    survivor = None
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        wait_for(
            lambda: any(client.scan_iter(match=f"{queue_name}:consumer:*")),
            timeout=60,
            what="the cut-off consumer to take its lease",
        )
        processing = f"{queue_name}:processing:*"

        def publish(n: int) -> None:
            with Connection(redis_url) as connection:
                connection.Producer().publish(
                    {"order": f"r{n}"},
                    routing_key=queue_name,
                    serializer="json",
                    headers={"outbox-message-id": f"r-{n}", "outbox-type": "payment.captured"},
                )

        def in_flight() -> int:
            return sum(client.llen(key) for key in client.scan_iter(match=processing))

        for _ in range(10):
            # Cut while its blocking move waits in Redis, then publish: Redis moves the
            # message into its processing list, and the answer vanishes.
            wait_for(
                lambda: any(c.get("cmd") == "blmove" for c in client.client_list()),
                timeout=10,
                what="the consumer to wait in Redis",
                interval=0.01,
            )
            away.cut()
            cut_at = time.monotonic()
            publish(0)
            time.sleep(0.5)
            if in_flight() == 1:
                break
            away.reconnect()  # its wait had ended: the message is still queued
            wait_for(lambda: Payment.objects.count() == 1, timeout=30, what="r0 handled there")
            Payment.objects.all().delete()
            InboxMessage.objects.all().delete()
        assert in_flight() == 1, "never cut off while Redis was handing it a message"
        for n in range(1, 5):
            publish(n)
        survivor = read_as_it_comes(
            spawn_manage("inbox_consume", "--json", "--batch", "10", env=subprocess_env())
        )
        wait_for(
            lambda: Payment.objects.count() >= 5,
            timeout=60,
            what="every message handled",
            interval=0.1,
        )
        taken_over = time.monotonic() - cut_at
        time.sleep(max(0.0, CUT_SECONDS - (time.monotonic() - cut_at)))
        away.reconnect()
        time.sleep(3)  # the cut-off consumer comes back, finds its connections gone
    finally:
        output = finish(doomed, signal.SIGKILL)
        if survivor is not None:
            finish(survivor, signal.SIGTERM)
    print(f"\nRedis consumer cut off: every message handled {taken_over:.2f} s after the cut")
    assert sorted(Payment.objects.values_list("order_ref", flat=True)) == [
        f"r{n}" for n in range(5)
    ], output
    assert InboxMessage.objects.count() == 5
    assert client.llen(queue_name) == 0
