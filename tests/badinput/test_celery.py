"""The Celery intake: each case sent as a peer's celery transport sends it (through
Redis), taken from the queue and run by Celery's worker request; every message is
acknowledged and recorded (the queue is empty afterwards)."""

import pytest
from celery import current_app
from celery.worker.request import Request
from kombu import Connection

from django_outbox.inbox.consumers.celery import receive_task
from django_outbox.models import InboxMessage
from tests.badinput.cases import ACCEPTED, CELERY, KEPT
from tests.badinput.support import grown, params, table_counts

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.redis]

INBOX = InboxMessage._meta.db_table


@pytest.fixture
def peer_queue(configure_outbox, queue_name):
    broker = current_app.conf.broker_url or ""
    if not broker.startswith("redis://"):
        pytest.skip("needs CELERY_BROKER_URL=redis://… (the Celery intake through a real broker)")
    configure_outbox(
        INBOX={
            "SOURCES": {"peer": {"TRANSPORT": "celery", "QUEUE": queue_name, "MAX_BODY_BYTES": 200}}
        }
    )
    return broker, queue_name


def deliver(broker, queue_name):
    """Take each message from *queue_name* and run it as a worker does."""
    task = receive_task
    with Connection(broker) as connection:
        queue = connection.SimpleQueue(queue_name, no_ack=False)
        try:
            while True:
                try:
                    message = queue.get(block=True, timeout=0.2)
                except queue.Empty:
                    return
                request = Request(
                    message,
                    on_ack=message.ack_log_error,
                    on_reject=message.reject_log_error,
                    app=current_app,
                    task=task,
                )
                request.execute()
        finally:
            queue.close()


@pytest.mark.parametrize("case", params(CELERY))
def test_celery_intake(case, peer_queue):
    broker, queue_name = peer_queue
    given = case.given
    headers = {"outbox-message-id": f"c-{case.id}", "outbox-type": "payment.captured"}
    headers.update(given.get("headers", {}))
    headers = {name: value for name, value in headers.items() if value is not None}
    args = given.get("args", [given.get("payload", {"order": case.id})])
    before = table_counts()
    for _ in range(2 if given.get("twice") else 1):
        current_app.send_task(
            "django_outbox.receive",
            args=args,
            kwargs=given.get("kwargs"),
            task_id=f"c-{case.id}",
            headers=headers,
            queue=queue_name,
        )
    deliver(broker, queue_name)
    with Connection(broker) as connection:
        assert connection.default_channel.client.llen(queue_name) == 0
    expect = case.expect
    changed = grown(before, table_counts())
    assert changed.get(INBOX) == 1, changed
    row = InboxMessage.objects.get()
    assert row.state == expect.what, row.last_error
    if expect.kind == KEPT:
        assert expect.says in row.last_error, row.last_error
    else:
        assert expect.kind == ACCEPTED
