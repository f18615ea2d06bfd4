"""The compiled record UPDATE (``lease.FencedRows``): on PostgreSQL, the statement that
records a group's shared values is compiled once per shape of values and run with fresh
parameters. It must write what Django's ``QuerySet.update`` writes, stay fenced by the
lease token, and compile once, not once per batch."""

import uuid

import pytest
from django.db import connection, transaction
from django.db.models import DateTimeField, F, Value
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_outbox
from django_outbox.engine import clock, lease
from django_outbox.jobs.models import Job, JobState
from django_outbox.outbox.models import OutboxMessage, OutboxState
from django_outbox.outbox.relay import Relay
from testproject.shop import jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

#: Columns whose values depend on when or by whom a row was written.
MOMENT = {
    "id",
    "message_id",
    "created_at",
    "available_at",
    "sent_at",
    "finished_at",
    "attempted_at",
    "first_started_at",
    "lock_token",
    "claimed_by",
    "payload",
}


@pytest.fixture(autouse=True)
def fresh_statements():
    lease._RECORDS.clear()
    yield
    lease._RECORDS.clear()


def send(count):
    with transaction.atomic():
        return [django_outbox.send("order.created", {"n": n}) for n in range(count)]


def recorded(message):
    row = OutboxMessage.objects.filter(pk=message.pk).values().get()
    return {name: value for name, value in row.items() if name not in MOMENT}


def test_the_relay_records_through_one_compiled_statement_per_shape(monkeypatch):
    compiled = []
    original = lease._compile_record
    monkeypatch.setattr(
        lease, "_compile_record", lambda *args: compiled.append(args[2]) or original(*args)
    )
    relay = Relay(batch_size=2)
    first = send(5)
    assert relay.drain().sent == 5  # three batches
    assert len(compiled) == 1
    assert all(m.state == OutboxState.SENT for m in OutboxMessage.objects.all())
    second = send(1)
    relay.drain()
    assert len(compiled) == 1  # the same shape again: no new compile
    row = OutboxMessage.objects.get(pk=second[0].pk)
    assert row.attempts == 1 and row.locked_until is None and row.sent_at is not None
    assert row.finished_at == row.sent_at
    assert row.attempted_at is not None
    assert first


def test_it_writes_what_django_update_writes(monkeypatch):
    compiled_rows = send(3)
    Relay().drain()
    monkeypatch.setattr(lease, "_RECORDS_MAX", 0)  # every statement through the ORM
    lease._RECORDS.clear()
    orm_rows = send(3)
    Relay().drain()
    for compiled_row, orm_row in zip(compiled_rows, orm_rows, strict=True):
        assert recorded(compiled_row) == recorded(orm_row)
        by_compiled = OutboxMessage.objects.get(pk=compiled_row.pk)
        assert by_compiled.sent_at == by_compiled.finished_at


def test_a_stale_token_or_state_changes_nothing():
    [message] = send(1)
    token = uuid.uuid4()
    OutboxMessage.objects.filter(pk=message.pk).update(
        state=OutboxState.SENDING, lock_token=token, locked_until=timezone.now()
    )
    values = {
        "state": OutboxState.SENT,
        "sent_at": clock.now(),
        "finished_at": clock.now(),
        "locked_until": None,
        "attempts": F("attempts") + 1,
    }
    other = lease.FencedRows(OutboxMessage, uuid.uuid4(), OutboxState.SENDING, "default")
    assert other.update([message.pk], values) == 0
    wrong_state = lease.FencedRows(OutboxMessage, token, OutboxState.SHOULD_BE_SENT, "default")
    assert wrong_state.update([message.pk], values) == 0
    assert OutboxMessage.objects.get(pk=message.pk).state == OutboxState.SENDING
    held = lease.FencedRows(OutboxMessage, token, OutboxState.SENDING, "default")
    with CaptureQueriesContext(connection) as queries:
        assert held.update([message.pk], values) == 1
    assert len(queries) == 1
    row = OutboxMessage.objects.get(pk=message.pk)
    assert row.state == OutboxState.SENT and row.attempts == message.attempts + 1
    assert row.sent_at is not None and row.locked_until is None


def test_jobs_with_their_own_return_values_are_recorded_with_them():
    with transaction.atomic():
        results = [jobs.add.enqueue(n, 1) for n in range(3)]
    from django_outbox.jobs.running import Jobs

    Jobs().drain()
    for n, result in enumerate(results):
        job = Job.objects.get(result_id=result.id)
        assert job.state == JobState.SUCCESSFUL
        assert job.return_value == n + 1


def test_a_time_read_once_is_a_parameter_not_a_new_statement(monkeypatch):
    """Jobs record a time read from the database as a ``Value``: each group has its own
    moment, and the statement must be the same (it once filled the cache with one
    statement per moment, then went through the ORM)."""
    from django_outbox.jobs.running import Jobs

    compiled = []
    original = lease._compile_record
    monkeypatch.setattr(
        lease, "_compile_record", lambda *args: compiled.append(args[2]) or original(*args)
    )
    for round_ in range(3):
        with transaction.atomic():
            results = [jobs.add.enqueue(n, round_) for n in range(2)]
        Jobs().drain()
        for n, result in enumerate(results):
            job = Job.objects.get(result_id=result.id)
            assert job.state == JobState.SUCCESSFUL and job.return_value == n + round_
            assert job.finished_at is not None and job.finished_at >= job.started_at
    assert len(compiled) == 1
    assert len(lease._RECORDS) == 1


def test_a_value_of_another_type_than_its_field_is_compiled():
    moment = Value(timezone.now(), output_field=DateTimeField())
    assert lease._plain_value(Job._meta, "finished_at", moment)
    assert not lease._plain_value(Job._meta, "finished_at", Value("2026-11-28 06:00"))
    assert not lease._plain_value(Job._meta, "last_error", moment)
    assert not lease._plain_value(Job._meta, "finished_at", F("started_at"))


def test_a_field_with_a_relation_falls_back_to_the_orm():
    assert lease._record_statement(Job, "default", {"batch": None}) is None
    assert lease._record_statement(Job, "default", {"not_a_field": 1}) is None
