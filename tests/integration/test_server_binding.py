"""The hot inserts of send(), enqueue() and receive() send their values apart from the
statement on PostgreSQL (server-side binding), and the values arrive as they were."""

from datetime import UTC, datetime

import pytest
from django.db import connection, transaction

import django_outbox
from django_outbox.jobs.models import Job
from django_outbox.models import InboxMessage, OutboxMessage
from testproject.shop import jobs
from tests.conftest import PARTITIONED

pytestmark = pytest.mark.django_db

#: Text that quoting into a statement's text has to get right: quotes, a percent sign,
#: a backslash, non-ASCII and a JSON-looking string.
AWKWARD = 'it\'s 100% \\ naïve \u2603 {"not": "an object"}'


class Cursors:
    """The driver cursors the statements of a block ran on, with their SQL."""

    def __init__(self):
        self.seen = []

    def __call__(self, execute, sql, params, many, context):
        self.seen.append((sql, context["cursor"].cursor))
        return execute(sql, params, many, context)

    def of(self, table):
        return [cursor for sql, cursor in self.seen if sql.startswith(f'INSERT INTO "{table}"')]


@pytest.fixture
def cursors():
    watching = Cursors()
    with connection.execute_wrapper(watching):
        yield watching


def _binds_on_the_server(cursor) -> bool:
    import psycopg

    return not isinstance(cursor, psycopg.ClientCursor)


@pytest.fixture
def postgresql_with_psycopg3():
    if connection.vendor != "postgresql":
        pytest.skip("server-side binding is PostgreSQL's (elsewhere Django's cursor binds)")
    pytest.importorskip("psycopg")


def test_send_binds_on_the_server(postgresql_with_psycopg3, cursors):
    with transaction.atomic():
        django_outbox.send("order.created", {"note": AWKWARD})
    inserts = cursors.of(OutboxMessage._meta.db_table)
    assert inserts and all(_binds_on_the_server(c) for c in inserts)


def test_enqueue_binds_on_the_server(postgresql_with_psycopg3, cursors):
    with transaction.atomic():
        jobs.add.enqueue(1, 2)
    inserts = cursors.of(Job._meta.db_table)
    assert inserts and all(_binds_on_the_server(c) for c in inserts)


def test_receive_binds_on_the_server(postgresql_with_psycopg3, cursors):
    if PARTITIONED:
        pytest.skip("a partitioned inbox's guarded insert still binds on the client")
    django_outbox.receive(
        "payment.captured", {"order": AWKWARD}, message_id="bound-1", source="payments"
    )
    inserts = cursors.of(InboxMessage._meta.db_table)
    assert inserts and all(_binds_on_the_server(c) for c in inserts)


def test_values_arrive_as_they_were_sent():
    """On every database: what the hot inserts wrote reads back equal."""
    moment = datetime(2026, 11, 28, 12, 30, 15, 123456, tzinfo=UTC)
    payload = {"note": AWKWARD, "n": 12345678901234, "x": 1.5, "none": None, "list": [AWKWARD]}
    with transaction.atomic():
        sent = django_outbox.send("order.created", payload, headers={"h": AWKWARD})
        enqueued = jobs.add.using(run_after=moment).enqueue(AWKWARD, payload)
    stored, _ = django_outbox.receive(
        "payment.captured", payload, message_id=f"m-{AWKWARD}", source="payments"
    )

    message = OutboxMessage.objects.get(pk=sent.pk)
    assert (message.payload, message.headers["h"]) == (payload, AWKWARD)
    job = Job.objects.get(result_id=enqueued.id)
    assert (job.args, job.run_after) == ([AWKWARD, payload], moment)
    row = InboxMessage.objects.get(pk=stored.pk)
    assert (row.payload, row.message_id) == (payload, f"m-{AWKWARD}")
