"""The inbox under concurrency and crashes, with real inbox_consume processes, real
RabbitMQ and SIGKILL: every message handled exactly once in effect."""

import json
import signal
import uuid

import pytest
from kombu import Connection

from django_outbox.models import InboxMessage, InboxState
from testproject.shop.models import Payment
from tests.acceptance.helpers import stop, wait_for
from tests.conftest import spawn_manage, subprocess_env

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.row_locks,
    pytest.mark.rabbitmq,
    pytest.mark.processes,
]


@pytest.fixture
def source(configure_outbox, amqp_url, queue_name):
    configure_outbox(
        INBOX={"SOURCES": {"shop": {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": queue_name}}}
    )
    with Connection(amqp_url) as connection:
        connection.SimpleQueue(queue_name).close()  # declare it before anyone publishes
    return amqp_url, queue_name


def publish(url, queue, messages):
    """Publish (message id, payload) pairs as our outbox does (headers, JSON body)."""
    with Connection(url) as connection:
        producer = connection.Producer()
        for message_id, payload in messages:
            producer.publish(
                payload,
                routing_key=queue,
                serializer="json",
                headers={"outbox-message-id": message_id, "outbox-type": "payment.captured"},
            )


def consumer(*args, **env):
    return spawn_manage(
        "inbox_consume", "--json", "--batch", "10", *args, env=subprocess_env(**env)
    )


def handled():
    return InboxMessage.objects.filter(state=InboxState.HANDLED).count()


def test_one_message_delivered_ten_times_through_four_consumers_is_handled_once(source):
    url, queue = source
    consumers = [consumer("--until-idle", "3") for _ in range(4)]
    try:
        message_id = str(uuid.uuid4())
        publish(url, queue, [(message_id, {"order": "once"})] * 10)
        wait_for(handled, timeout=60, what="the message to be handled")
        # Each exits 3 s after its last message (a SIGTERM could reach one still starting).
        outputs = [c.communicate(timeout=60)[0] for c in consumers]
    finally:
        for c in consumers:
            if c.poll() is None:
                stop(c)
    assert InboxMessage.objects.count() == 1
    assert Payment.objects.filter(order_ref="once").count() == 1, outputs
    received = sum(json.loads(out.strip().splitlines()[-1])["received"] for out in outputs)
    assert received == 10  # every copy reached a consumer, and was acknowledged


def test_a_consumer_killed_after_storing_before_acking(source, tmp_path):
    url, queue = source
    publish(url, queue, [(f"m-{n}", {"order": f"o{n}"}) for n in range(50)])
    marker = tmp_path / "stored"
    doomed = consumer("--no-handle", TESTPROJECT_FREEZE_AFTER_STORE=str(marker))
    try:
        wait_for(marker.exists, timeout=60, what="the first batch to be stored")
    finally:
        stop(doomed, signal.SIGKILL)
    stored_before = InboxMessage.objects.count()
    assert stored_before >= 1  # committed, never acknowledged
    survivor = consumer("--until-idle", "3")
    output = stop_when(survivor, lambda: handled() == 50)
    counts = json.loads(output.strip().splitlines()[-1])
    assert counts["duplicates"] >= stored_before  # redelivered, recognised
    assert InboxMessage.objects.count() == 50
    assert Payment.objects.count() == 50  # each effect exactly once


def test_a_consumer_killed_inside_a_handler(source, tmp_path):
    """inbox_consume stores and handles a batch in one transaction: killed inside a
    handler, it leaves nothing behind, and the broker delivers the batch again."""
    url, queue = source
    publish(url, queue, [(f"k-{n}", {"order": f"k{n}"}) for n in range(5)])
    marker = tmp_path / "in-handler"
    doomed = consumer(TESTPROJECT_FREEZE_IN_HANDLER=str(marker))
    try:
        wait_for(marker.exists, timeout=60, what="a handler to start")
    finally:
        stop(doomed, signal.SIGKILL)
    # The rows, the handler's write and the acknowledgement died with the process.
    assert not InboxMessage.objects.exists()
    assert not Payment.objects.exists()
    survivor = consumer("--until-idle", "3", TESTPROJECT_FREEZE_IN_HANDLER=str(marker))
    output = stop_when(survivor, lambda: handled() == 5)
    assert json.loads(output.strip().splitlines()[-1])["received"] == 5  # redelivered
    assert InboxMessage.objects.count() == 5
    assert Payment.objects.count() == 5


def test_a_worker_killed_inside_a_handler_of_stored_messages(source, tmp_path):
    """Messages stored earlier (``--no-handle``, committed and acknowledged) are claimed
    under row locks by whoever handles them; killed inside a handler, that worker's
    transaction is rolled back and the next one handles every message once."""
    url, queue = source
    publish(url, queue, [(f"s-{n}", {"order": f"s{n}"}) for n in range(5)])
    storer = consumer("--no-handle", "--until-idle", "1")
    stop_when(storer, lambda: InboxMessage.objects.count() == 5)
    marker = tmp_path / "in-handler"
    # An idle consumer handles what is due: here, the five stored messages.
    doomed = consumer(TESTPROJECT_FREEZE_IN_HANDLER=str(marker))
    try:
        wait_for(marker.exists, timeout=60, what="a handler to start")
    finally:
        stop(doomed, signal.SIGKILL)
    assert handled() == 0
    assert not Payment.objects.exists()  # the killed handler's write was rolled back
    # The dead consumer's claims come back once the survivor's heartbeat finds it dead
    # (WORKER_TIMEOUT_SECONDS), not after their 60 s lease.
    survivor = consumer("--until-idle", "10", TESTPROJECT_FREEZE_IN_HANDLER=str(marker))
    stop_when(survivor, lambda: handled() == 5, timeout=30)
    assert Payment.objects.count() == 5
    # The killed batch's attempt was counted before its handlers ran (a handler that kills
    # its worker uses up its attempts); the survivor's is the second.
    assert InboxMessage.objects.filter(attempts=2).count() == 5


def stop_when(process, condition, timeout=60):
    try:
        wait_for(condition, timeout=timeout, what="the survivor to finish the work")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the survivor said:\n{stop(process)}") from None
    return stop(process)
