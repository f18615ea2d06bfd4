"""The queue tables' autovacuum settings on PostgreSQL (``engine.vacuum``, migration
0022): vacuumed by a fixed number of dead rows, whatever the table holds, with index
cleanup always on. Runs on plain tables and, in ``make test-partitioned``, on
partitioned ones (each partition carries them)."""

import pytest
from django.db import connection

from django_outbox.engine import partitions, vacuum
from django_outbox.models import InboxMessage, Job, OutboxMessage

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]

EXPECTED = dict(vacuum.OPTIONS)


def tables_holding_rows(table):
    with connection.cursor() as cursor:
        return vacuum._targets(cursor, table)


@pytest.mark.parametrize("table", vacuum.QUEUE_TABLES)
def test_each_queue_table_or_partition_is_vacuumed_by_dead_rows(table):
    holders = tables_holding_rows(table)
    assert holders, f"{table} not found"
    with connection.cursor() as cursor:
        for name in holders:
            assert vacuum.options_of(cursor, name) == EXPECTED, name


def test_other_tables_keep_the_server_defaults():
    with connection.cursor() as cursor:
        for table in ("django_outbox_worker", "django_outbox_key", "django_outbox_inbox_seen"):
            for name in vacuum._targets(cursor, table):
                assert vacuum.options_of(cursor, name) == {}, name


def test_untune_resets_and_tune_sets_again():
    table = "django_outbox_job"
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        changed = vacuum.untune(cursor, quote, table)
        assert changed == vacuum._targets(cursor, table)
        assert all(vacuum.options_of(cursor, name) == {} for name in changed)
        vacuum.tune(cursor, quote, table)
        assert all(vacuum.options_of(cursor, name) == EXPECTED for name in changed)


def test_new_partitions_of_a_partitioned_queue_table_get_the_settings():
    """Only where the tables are partitioned (``make test-partitioned``)."""
    if partitions.layout(Job, "default") is None:
        pytest.skip("the tables are not partitioned in this session")
    for model in (OutboxMessage, InboxMessage, Job):
        partitions.create_ahead(model, "default", ahead=9)
        with connection.cursor() as cursor:
            for found in partitions.partitions(model, "default"):
                assert vacuum.options_of(cursor, found.name) == EXPECTED, found.name


def test_the_clause_names_every_option():
    assert vacuum.clause() == (
        "WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000, "
        "vacuum_index_cleanup = on)"
    )
