"""Identifiers compare byte for byte on every database (guarantee 9): ids, keys, types and
queue names that differ only in case or by a trailing space are different values.

PostgreSQL and SQLite compare bytes already. MySQL's and MariaDB's default collations
ignore case (MariaDB's trailing spaces too); migrations 0002 and 0011 give those
columns binary NO PAD collations. These tests run on every database and mean the most
on MariaDB (``DATABASE_URL=mysql://…``).
"""

import importlib

import pytest
from django.db import connection, models

import django_outbox
from django_outbox.inbox.handling import Inbox
from django_outbox.jobs.models import Job, JobKey, JobState
from django_outbox.jobs.running import Jobs
from django_outbox.models import InboxCursor, InboxMessage, OutboxMessage
from testproject.shop import jobs
from testproject.shop.models import Payment

pytestmark = pytest.mark.django_db(transaction=True)

#: Three different values under a byte-for-byte comparison; one under MariaDB's default.
VARIANTS = ("evt_abc", "evt_AbC", "evt_abc ")


def receive(message_type, **kwargs):
    kwargs.setdefault("source", "partner")
    return django_outbox.receive(message_type, {"order": kwargs["message_id"]}, **kwargs)


def test_inbox_message_ids_differing_in_case_or_a_trailing_space_are_three_messages():
    created = [receive("payment.captured", message_id=mid)[1] for mid in VARIANTS]
    assert created == [True, True, True]
    assert sorted(InboxMessage.objects.values_list("message_id", flat=True)) == sorted(VARIANTS)
    assert Inbox().drain().done == 3
    assert sorted(Payment.objects.values_list("order_ref", flat=True)) == sorted(VARIANTS)
    # Each is still its own duplicate.
    assert [receive("payment.captured", message_id=mid)[1] for mid in VARIANTS] == [False] * 3
    assert InboxMessage.objects.count() == 3


def test_sources_differing_in_case_or_a_trailing_space_are_three_sources():
    for source in ("partner", "Partner", "partner "):
        assert receive("payment.captured", source=source, message_id="m-1")[1]
    assert InboxMessage.objects.filter(source="partner").count() == 1


def test_ordering_keys_differing_in_case_or_a_trailing_space_have_a_cursor_each():
    for n, key in enumerate(VARIANTS):
        receive("order.step", message_id=f"step-{n}", key=key, sequence=1)
    result = Inbox().drain()
    # One shared cursor would handle the first and skip the other two as "not newer".
    assert (result.done, result.skipped) == (3, 0)
    cursors = InboxCursor.objects.values_list("key", "last_sequence")
    assert sorted(cursors) == sorted((key, 1) for key in VARIANTS)
    assert Payment.objects.count() == 3


def test_lookups_by_type_and_correlation_id_are_exact():
    receive("payment.captured", message_id="m-1", correlation_id="req-A")
    django_outbox.send("payment.captured", {}, correlation_id="req-A")
    for model in (InboxMessage, OutboxMessage):
        rows = model.objects.all()
        assert not rows.filter(type="Payment.Captured").exists()
        assert not rows.filter(type="payment.captured ").exists()
        assert not rows.filter(correlation_id="req-a").exists()
        assert rows.filter(type="payment.captured", correlation_id="req-A").count() == 1


def test_unique_keys_differing_in_case_or_a_trailing_space_are_independent_jobs():
    results = [jobs.sync_customer.enqueue(customer=c) for c in ("c-a", "c-A", "c-a ")]
    assert len({result.id for result in results}) == 3
    keys = Job.objects.values_list("unique_key", flat=True)
    assert sorted(keys) == sorted(["sync-c-a", "sync-c-A", "sync-c-a "])
    # The same key again is still the same active job.
    assert jobs.sync_customer.enqueue(customer="c-A").id == results[1].id


def test_serial_keys_differing_in_case_or_a_trailing_space_are_independent():
    for order in VARIANTS:
        jobs.order_step.enqueue(order=order, step=1)
    assert sorted(JobKey.objects.values_list("serial_key", "last_sequence")) == sorted(
        (f"order-{order}", 1) for order in VARIANTS
    )
    assert list(Job.objects.values_list("sequence", flat=True)) == [1, 1, 1]
    # Three heads: one runner claims all three at once (one key would give one).
    rows, _ = Jobs(batch_size=10).claim_batch()
    assert len(rows) == 3


def test_a_failed_serial_key_parks_only_itself_not_its_case_variants():
    jobs.order_step.enqueue(order="o-a", step=1, fail=True)
    Jobs().drain()
    assert JobKey.objects.get(serial_key="order-o-a").blocked
    jobs.order_step.enqueue(order="o-A", step=1)
    jobs.order_step.enqueue(order="o-a ", step=1)
    assert Jobs().drain().done == 2
    assert sorted(JobKey.objects.values_list("serial_key", "blocked")) == [
        ("order-o-A", False),
        ("order-o-a", True),
        ("order-o-a ", False),
    ]


def test_a_worker_of_one_queue_takes_only_that_queue_byte_for_byte():
    for queue in ("emails", "Emails", "emails "):
        result = jobs.add.enqueue(1, 2)
        Job.objects.filter(result_id=result.id).update(queue_name=queue)
    rows, _ = Jobs(queues=["emails"], batch_size=10).claim_batch()
    assert [row.queue_name for row in rows] == ["emails"]
    assert Job.objects.filter(state=JobState.READY).count() == 2


# Guards: every text column of ours is either compared byte for byte or named here
# as one that need not be, so a new identifier column cannot slip through.

#: Columns written only by the code (choices, fixed names) or free text.
NOT_IDENTIFIERS = {
    ("OutboxMessage", "state"),
    ("OutboxMessage", "last_error"),
    ("InboxMessage", "state"),
    ("InboxMessage", "last_error"),
    ("InboxMessage", "raw_body"),
    ("InboxMessage", "traceback"),
    ("Job", "state"),
    ("Job", "resolution"),
    ("Job", "last_error"),
    ("JobBatch", "callback_path"),
    ("JobBatch", "last_error"),
    ("Worker", "name"),
    ("Worker", "attempt_ids"),
    ("SweepMark", "part"),
    ("SweepMark", "ran_by"),
    # The health page's per-minute counts: names the code writes.
    ("MinuteCount", "part"),
    ("MinuteCount", "event"),
    # A W3C traceparent (lowercase hex): carried, never looked up.
    ("Job", "traceparent"),
    # Identifiers, but written and read only by a partitioned inbox, which is
    # PostgreSQL's (engine.partitions): on MySQL/MariaDB the table stays empty.
    ("InboxSeen", "source"),
    ("InboxSeen", "message_id"),
}


def binary_columns():
    """(model name, field name) of every column migrations 0002 and 0011 make binary."""
    migration = importlib.import_module("django_outbox.migrations.0011_mysql_binary_identifiers")
    by_table = {
        model._meta.db_table: model.__name__
        for model in django_outbox_models()
        if not model._meta.proxy
    }
    early = importlib.import_module("django_outbox.migrations.0002_mysql_indexes")
    columns = {(by_table[table], column.strip("`")) for table, column, _, _ in early.BINARY_COLUMNS}
    columns |= {
        (model, field) for model, fields in migration.IDENTIFIERS.items() for field in fields
    }
    return columns


def django_outbox_models():
    from django.apps import apps

    return apps.get_app_config("django_outbox").get_models()


def test_every_text_column_is_binary_or_named_as_not_an_identifier():
    text = {
        (model.__name__, field.name)
        for model in django_outbox_models()
        if not model._meta.proxy  # the health page's entry: no table of its own
        for field in model._meta.concrete_fields
        if isinstance(field, (models.CharField, models.TextField))
    }
    binary = binary_columns()
    assert binary <= text
    assert text - binary == NOT_IDENTIFIERS


@pytest.mark.skipif(
    connection.vendor != "mysql",
    reason="collations are a MySQL/MariaDB matter (PostgreSQL and SQLite compare bytes)",
)
def test_on_mysql_the_identifier_columns_have_a_binary_no_pad_collation():
    expected = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
    by_name = {model.__name__: model for model in django_outbox_models()}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT TABLE_NAME, COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE()"
        )
        collations = {(table, column): collation for table, column, collation in cursor}
    for model_name, field_name in sorted(binary_columns()):
        model = by_name[model_name]
        column = model._meta.get_field(field_name).column
        assert collations[(model._meta.db_table, column)] == expected, (model_name, field_name)
