"""A poison message (its handler kills the process: out of memory, a segfault,
``os._exit``) with real ``inbox_worker`` processes: its attempts are counted although
its transaction dies with the worker, after ``MAX_ATTEMPTS`` it is parked in
``handle_error`` with the reason, and every other message of its batch is handled
exactly once, instead of the batch looping forever."""

import time

import pytest

import django_outbox
from django_outbox.models import InboxMessage, InboxState
from testproject.shop.models import Payment
from tests.acceptance.helpers import finish, read_as_it_comes
from tests.conftest import spawn_manage

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.row_locks,
    pytest.mark.processes,
]

#: The poison's attempts: each ends with its worker's death.
MAX_ATTEMPTS = 3


def worker():
    return read_as_it_comes(spawn_manage("inbox_worker", "--json", "--interval", "0.1"))


def test_a_handler_that_kills_its_worker_is_counted_parked_and_leaves_its_batch_handled(
    configure_outbox,
):
    configure_outbox(INBOX={"SOURCES": {"shop": {"TRANSPORT": "local"}}, "MAX_ATTEMPTS": 3})
    for n in range(30):
        payload = {"order": f"p-{n}", "kills_its_worker": n == 10}
        django_outbox.receive("payment.captured", payload, source="shop", message_id=f"p-{n}")
    deaths = 0
    deadline = time.monotonic() + 120
    current = worker()
    try:
        while time.monotonic() < deadline:
            handled = InboxMessage.objects.filter(state=InboxState.HANDLED).count()
            parked = InboxMessage.objects.filter(state=InboxState.HANDLE_ERROR).count()
            if handled == 29 and parked == 1:
                break
            if current.poll() is not None:
                output = finish(current)
                assert current.returncode == 70, output  # the poison's exit, nothing else
                deaths += 1
                current = worker()  # a supervisor restarts it
            time.sleep(0.2)
    finally:
        finish(current)
    poison = InboxMessage.objects.get(message_id="p-10")
    assert poison.state == InboxState.HANDLE_ERROR
    assert poison.attempts == MAX_ATTEMPTS
    assert "its worker stopped during its last attempt" in poison.last_error
    assert f"its {MAX_ATTEMPTS} attempt(s) are used up" in poison.last_error
    # It killed its worker once per attempt, and not again once parked.
    assert deaths == MAX_ATTEMPTS
    refs = sorted(Payment.objects.values_list("order_ref", flat=True))
    assert refs == sorted(f"p-{n}" for n in range(30) if n != 10)  # each once
    # The others were charged at most the one batch the poison first killed.
    others = InboxMessage.objects.exclude(message_id="p-10")
    assert set(others.values_list("attempts", flat=True)) <= {1, 2}
    assert not others.filter(attempt_open=True).exists()


@pytest.mark.rabbitmq
def test_a_poison_message_through_inbox_consume_is_parked_instead_of_crash_looping(
    configure_outbox, amqp_url, queue_name
):
    """``inbox_consume`` stores and handles a batch in one transaction: the poison's
    death rolls the rows back, the broker redelivers them, and (before) every
    consumer that received them died again. A redelivered batch is stored first and
    handled through counted claims: the poison is parked, the rest handled once."""
    from kombu import Connection

    configure_outbox(
        INBOX={
            "SOURCES": {"shop": {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": queue_name}},
            "MAX_ATTEMPTS": 3,
        }
    )
    with Connection(amqp_url) as connection:
        producer = connection.Producer()
        for n in range(20):
            producer.publish(
                {"order": f"c-{n}", "kills_its_worker": n == 7},
                routing_key=queue_name,
                serializer="json",
                declare=[connection.SimpleQueue(queue_name).queue],
                headers={"outbox-message-id": f"c-{n}", "outbox-type": "payment.captured"},
            )

    def consumer():
        return read_as_it_comes(spawn_manage("inbox_consume", "--json", "--batch", "50"))

    deaths = 0
    deadline = time.monotonic() + 120
    current = consumer()
    try:
        while time.monotonic() < deadline:
            handled = InboxMessage.objects.filter(state=InboxState.HANDLED).count()
            parked = InboxMessage.objects.filter(state=InboxState.HANDLE_ERROR).count()
            if handled == 19 and parked == 1:
                break
            if current.poll() is not None:
                output = finish(current)
                assert current.returncode == 70, output
                deaths += 1
                assert deaths <= MAX_ATTEMPTS + 1, "the consumer keeps dying"
                current = consumer()
            time.sleep(0.2)
    finally:
        finish(current)
    poison = InboxMessage.objects.get(message_id="c-7")
    assert poison.state == InboxState.HANDLE_ERROR
    assert "its worker stopped during its last attempt" in poison.last_error
    refs = sorted(Payment.objects.values_list("order_ref", flat=True))
    assert refs == sorted(f"c-{n}" for n in range(20) if n != 7)
