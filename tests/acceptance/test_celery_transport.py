"""The Celery transport calls another service's task: payload as its argument,
task id = message id, outbox headers on the task message."""

import json
import subprocess
import sys
import time

import pytest
import redis

import django_outbox
from django_outbox.outbox.relay import Relay
from tests.acceptance.helpers import stop, wait_for
from tests.conftest import ROOT, subprocess_env

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.redis,
    pytest.mark.processes,
]


def test_remote_task_receives_the_payload_with_the_message_id_as_task_id(
    configure_outbox, redis_url, queue_name
):
    configure_outbox(
        DESTINATIONS={
            "billing": {"TRANSPORT": "celery", "TASK": "billing.charge_order", "QUEUE": queue_name}
        }
    )
    first = django_outbox.send("order.created", {"order_id": 1}, to="billing", key="order:1")
    second = django_outbox.send("order.created", {"order_id": 2}, to="billing", key="order:1")
    assert Relay().drain().sent == 2

    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "testproject", "worker", "--pool=solo"),
            *("-Q", queue_name, "--without-heartbeat", "--without-gossip", "--without-mingle"),
        ],
        cwd=ROOT,
        env=subprocess_env(TESTPROJECT_REMOTE_LOG_URL=redis_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    client = redis.Redis.from_url(redis_url)
    try:
        wait_for(lambda: client.llen("remote-calls") == 2, timeout=60, what="the remote task")
    finally:
        stop(worker)
    calls = [json.loads(item) for item in client.lrange("remote-calls", 0, -1)]
    assert [c["payload"] for c in calls] == [{"order_id": 1}, {"order_id": 2}]
    assert [c["task_id"] for c in calls] == [str(first.message_id), str(second.message_id)]
    assert calls[0]["headers"]["outbox-message-id"] == str(first.message_id)
    assert calls[1]["headers"]["outbox-sequence"] == "2"


def test_our_celery_transport_delivers_into_our_inbox_through_a_real_worker(
    configure_outbox, redis_url, queue_name
):
    from django_outbox.models import InboxMessage, InboxState
    from testproject.shop.models import Payment

    configure_outbox(
        DESTINATIONS={
            "peer": {"TRANSPORT": "celery", "TASK": "django_outbox.receive", "QUEUE": queue_name}
        },
        INBOX={"SOURCES": {"peer": {"TRANSPORT": "celery", "QUEUE": queue_name}}},
    )
    sent = [
        django_outbox.send("payment.captured", {"order": f"o{n}"}, to="peer", key="order:1")
        for n in range(3)
    ]
    assert Relay().drain().sent == 3
    # The same messages once more: a sender that retried after a lost confirm.
    from django_outbox.models import OutboxMessage, OutboxState

    OutboxMessage.objects.update(state=OutboxState.SHOULD_BE_SENT)
    assert Relay().drain().sent == 3
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "testproject", "worker", "--pool=solo"),
            *("-Q", queue_name, "--without-heartbeat", "--without-gossip", "--without-mingle"),
        ],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(
            lambda: InboxMessage.objects.filter(state=InboxState.HANDLED).count() == 3,
            timeout=60,
            what="the worker to store and handle the deliveries",
        )
        time.sleep(1)  # the duplicates arrive after the originals: give them time
    finally:
        output = stop(worker)
    stored = InboxMessage.objects.order_by("sequence")
    assert [m.message_id for m in stored] == [str(m.message_id) for m in sent], output
    assert {m.source for m in stored} == {"peer"}
    assert [m.sequence for m in stored] == [1, 2, 3]
    assert Payment.objects.count() == 3  # six deliveries, three effects
