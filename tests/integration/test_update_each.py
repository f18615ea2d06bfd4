"""``lease.update_each``: each row's own values written in one statement per chunk, on
every database. Jobs returning their own values and relays recording their own errors
write through it, so a value read back must be the value written, with its type."""

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_outbox.engine import lease
from django_outbox.outbox.models import OutboxMessage, OutboxState
from tests.factories import OutboxMessageFactory

pytestmark = pytest.mark.django_db

RELAY_A = uuid.uuid4()

#: JSON values Python calls equal that a JSON column must keep apart.
VALUES = [True, 1, 1.0, "1", None, [1, "two"], {"nested": {"n": 1}}, {}, "", "é\\n"]


def updates(queries):
    return [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("UPDATE")]


def test_each_row_reads_back_its_own_json_value_with_its_type():
    rows = OutboxMessageFactory.create_batch(len(VALUES))
    sent = timezone.now()
    values = {
        row.pk: {
            "state": OutboxState.SENT,
            "sent_at": sent,
            "finished_at": sent,
            "headers": {"v": value},
        }
        for row, value in zip(rows, VALUES, strict=True)
    }

    with CaptureQueriesContext(connection) as queries:
        written = lease.update_each(OutboxMessage.objects.all(), values)

    assert written == len(rows)
    assert len(updates(queries)) == 1
    for row, value in zip(rows, VALUES, strict=True):
        row.refresh_from_db()
        assert row.headers == {"v": value}
        assert type(row.headers["v"]) is type(value)
        assert row.state == OutboxState.SENT
        assert abs(row.sent_at - sent) < timedelta(milliseconds=1)


def test_a_field_some_rows_leave_out_keeps_its_value_in_those_rows():
    first, second, third = OutboxMessageFactory.create_batch(3, last_error="before")
    values = {
        first.pk: {"last_error": "first's", "headers": {"n": 1}},
        second.pk: {"headers": {"n": 2}},
        third.pk: {"last_error": "third's", "headers": {"n": 3}},
    }

    lease.update_each(OutboxMessage.objects.all(), values)

    read = {m.pk: m.last_error for m in OutboxMessage.objects.all()}
    assert read == {first.pk: "first's", second.pk: "before", third.pk: "third's"}


def test_an_expression_beside_plain_values_is_evaluated_per_row():
    first, second = OutboxMessageFactory.create_batch(2, attempts=4)
    values = {
        first.pk: {"attempts": F("attempts") + 1, "headers": {"n": 1}},
        second.pk: {"attempts": 9, "headers": {"n": 2}},
    }

    lease.update_each(OutboxMessage.objects.all(), values)

    read = {m.pk: m.attempts for m in OutboxMessage.objects.all()}
    assert read == {first.pk: 5, second.pk: 9}


def test_one_expression_shared_by_every_row_is_evaluated_on_each_row():
    first, second = OutboxMessageFactory.create_batch(2)
    OutboxMessage.objects.filter(pk=second.pk).update(attempts=7)
    counted = F("attempts") + 1  # a shared change: one object in every row's values
    values = {
        first.pk: {"attempts": counted, "headers": {"n": 1}},
        second.pk: {"attempts": counted, "headers": {"n": 2}},
    }

    lease.update_each(OutboxMessage.objects.all(), values)

    read = {m.pk: (m.attempts, m.headers) for m in OutboxMessage.objects.all()}
    assert read == {first.pk: (1, {"n": 1}), second.pk: (8, {"n": 2})}


def test_rows_the_queryset_no_longer_matches_are_left_alone_and_not_counted():
    held, taken = OutboxMessageFactory.create_batch(2, claimed_by=RELAY_A)
    OutboxMessage.objects.filter(pk=taken.pk).update(claimed_by=uuid.uuid4())
    values = {
        held.pk: {"last_error": "a's", "headers": {"n": 1}},
        taken.pk: {"last_error": "a's", "headers": {"n": 2}},
    }

    written = lease.update_each(OutboxMessage.objects.filter(claimed_by=RELAY_A), values)

    assert written == 1
    taken.refresh_from_db()
    assert (taken.last_error, taken.headers) == ("", {})


def test_rows_past_a_chunk_go_in_a_statement_per_chunk(monkeypatch):
    monkeypatch.setattr(lease, "UPDATE_CHUNK", 4)
    rows = OutboxMessageFactory.create_batch(10)
    values = {row.pk: {"headers": {"n": n}} for n, row in enumerate(rows)}

    with CaptureQueriesContext(connection) as queries:
        written = lease.update_each(OutboxMessage.objects.all(), values)

    assert written == 10
    assert len(updates(queries)) == 3
    read = {m.pk: m.headers for m in OutboxMessage.objects.all()}
    assert read == {row.pk: {"n": n} for n, row in enumerate(rows)}


def test_a_value_too_long_for_its_column_is_refused_not_cut():
    first, second = OutboxMessageFactory.create_batch(2)
    values = {first.pk: {"type": "x" * 300}, second.pk: {"type": "short"}}

    if connection.vendor == "sqlite":  # no length is enforced: kept whole
        lease.update_each(OutboxMessage.objects.all(), values)
        first.refresh_from_db()
        assert first.type == "x" * 300
        return
    with pytest.raises(Exception, match="(?i)too long"):
        lease.update_each(OutboxMessage.objects.all(), values)
