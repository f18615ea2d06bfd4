"""inbox_consume against real RabbitMQ and Redis: each bad message is kept as
handle_error with its reason and acknowledged (the queue is empty afterwards)."""

import io
import json

import pytest
from django.core.management import call_command
from kombu import Connection

from django_outbox.models import InboxMessage
from testproject.shop.models import Payment
from tests.badinput.cases import ACCEPTED, KEPT, KOMBU
from tests.badinput.support import grown, table_counts
from tests.integration.test_kombu_transport import drain_queue

pytestmark = pytest.mark.django_db(transaction=True)

INBOX = InboxMessage._meta.db_table
PAYMENTS = Payment._meta.db_table


@pytest.fixture(
    params=[
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
        pytest.param("redis", marks=pytest.mark.redis),
    ]
)
def broker(request, configure_outbox, queue_name):
    url = request.getfixturevalue("amqp_url" if request.param == "rabbitmq" else "redis_url")
    configure_outbox(
        INBOX={
            "SOURCES": {
                "shop": {
                    "TRANSPORT": "kombu",
                    "URL": url,
                    "QUEUE": queue_name,
                    "MAX_BODY_BYTES": 200,
                }
            }
        }
    )
    return url, queue_name


def published(case):
    """(body, content type, headers) of *case*'s message, its id its own."""
    given = case.given
    headers = {"outbox-message-id": f"k-{case.id}", "outbox-type": "payment.captured"}
    headers.update(given.get("headers", {}))
    headers = {name: value for name, value in headers.items() if value is not None}
    body = given.get("body", b'{"order": "%s"}' % case.id.encode())
    return body, given.get("content_type", "application/json"), headers


def test_kombu_consumer(broker, subtests):
    """Every case in one queue, consumed by one inbox_consume run (a batch mixing them,
    as a queue would); then each case's row is checked on its own."""
    url, queue_name = broker
    before = table_counts()
    with Connection(url) as connection:
        connection.SimpleQueue(queue_name).close()  # declares it
        producer = connection.Producer()
        for case in KOMBU.cases:
            body, content_type, headers = published(case)
            for _ in range(2 if case.given.get("twice") else 1):
                producer.publish(
                    body,
                    routing_key=queue_name,
                    content_type=content_type,
                    content_encoding="binary",
                    headers=headers,
                )
    out = io.StringIO()
    call_command("inbox_consume", "--json", "--until-idle", "0.5", stdout=out)
    counts = json.loads(out.getvalue().strip().splitlines()[-1])
    # Acknowledged and recorded: nothing left in the queue, one row per message.
    assert drain_queue(url, queue_name, timeout=0.3) == []
    twice = sum(1 for case in KOMBU.cases if case.given.get("twice"))
    assert (counts["received"], counts["duplicates"]) == (len(KOMBU.cases) + twice, twice)
    accepted = sum(1 for case in KOMBU.cases if case.expect.kind == ACCEPTED)
    # Each accepted message handled once (one payment each), duplicates included.
    assert grown(before, table_counts()) == {INBOX: len(KOMBU.cases), PAYMENTS: accepted}
    rows = {row.message_id: row for row in InboxMessage.objects.all()}
    for case in KOMBU.cases:
        with subtests.test(case=case.id):
            check(case, rows)


def check(case, rows):
    body, _, headers = published(case)
    expect = case.expect
    if "outbox-message-id" in headers:
        row = rows[headers["outbox-message-id"]]
    else:
        [row] = [
            r for i, r in rows.items() if i.startswith("sha256:") and r.raw_body in body.decode()
        ]
    assert row.state == expect.what, row.last_error
    if expect.kind == KEPT:
        assert expect.says in row.last_error, row.last_error
        assert "\x00" not in row.raw_body + row.last_error + row.message_id
        if "raw body kept" in expect.stored:
            assert row.raw_body
    else:
        assert expect.kind == ACCEPTED
        assert row.key == headers.get("outbox-key")
