"""What the admin's pages ask PostgreSQL, EXPLAINed over tables of 20,000 rows: every
search, and a request's and a reply's page, read indexes, never the whole table (at 5
million rows a read of the table is 0.3-4 s; ``make bench-admin`` measures them)."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_outbox.jobs.models import Job, JobState
from django_outbox.models import InboxMessage, InboxState, OutboxMessage, OutboxState
from django_outbox.wire import HEADER_REPLY_TO

pytestmark = [pytest.mark.django_db, pytest.mark.postgres, pytest.mark.plans]

ROWS = 20_000
NOW = timezone.now()


@pytest.fixture(scope="module")
def tables(django_db_setup, django_db_blocker):
    """20,000 rows in each table, shaped as the benchmark's, made once for the module
    (each test's own rows roll back): half the messages keyed, a third with a
    correlation id, jobs over ten task paths, one in ten with a unique key; ANALYZEd."""
    with django_db_blocker.unblock():
        fill()
        yield
        for model in (OutboxMessage, InboxMessage, Job):
            model.objects.all().delete()


def fill():
    OutboxMessage.objects.bulk_create(
        OutboxMessage(
            type=("order.created", "invoice.sent")[n % 2],
            destination="default",
            payload={},
            key=f"order:{n // 2}" if n % 2 == 0 else None,
            sequence=1 if n % 2 == 0 else None,
            correlation_id=f"req-{n}" if n % 3 == 0 else None,
            headers={HEADER_REPLY_TO: "replies"} if n % 3 == 0 else {},
            state=OutboxState.SENT,
            sent_at=NOW,
            finished_at=NOW,
        )
        for n in range(ROWS)
    )
    InboxMessage.objects.bulk_create(
        InboxMessage(
            source=("orders", "replies", "partner")[n % 3],
            message_id=f"evt-{n}",
            type="order.paid",
            payload={},
            key=f"customer:{n // 2}" if n % 2 == 0 else None,
            sequence=1 if n % 2 == 0 else None,
            correlation_id=f"req-{n}" if n % 3 == 1 else None,
            state=InboxState.HANDLED,
            finished_at=NOW,
        )
        for n in range(ROWS)
    )
    Job.objects.bulk_create(
        Job(
            task_path=f"shop.jobs.task_{n % 10}",
            unique_key=f"sync:{n}" if n % 10 == 0 else None,
            state=JobState.SUCCESSFUL,
            finished_at=NOW,
        )
        for n in range(ROWS)
    )
    with connection.cursor() as cursor:
        for table in ("django_outbox_message", "django_outbox_inbox", "django_outbox_job"):
            cursor.execute(f"ANALYZE {table}")


@pytest.fixture(autouse=True)
def sweeps_run():
    """The sweeps run, as in production: the list does not look for rows a stale sweep
    left behind (``engine.sweeps.stale_sweeps``)."""
    from django_outbox.engine.models import SweepMark

    for part in ("outbox", "inbox", "jobs"):
        SweepMark.objects.update_or_create(
            part=part, defaults={"last_run_at": timezone.now(), "ran_by": "test:1"}
        )


def plans(client, url, table):
    """The plans of the statements that opening *url* sends about *table*."""
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, url
    statements = [
        q["sql"]
        for q in captured.captured_queries
        if f'FROM "{table}"' in q["sql"] and q["sql"].lstrip().startswith("SELECT")
    ]
    assert statements, url
    found = []
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute("EXPLAIN " + sql)
            found.append((sql, "\n".join(line for (line,) in cursor.fetchall())))
    return response, found


def assert_reads_indexes(found, table, *indexes, dense=False):
    """No statement reads the whole of *table* (by a sequential scan or a walk of its
    primary key), and each of *indexes* serves one (the page or its count)."""
    for sql, plan in found:
        assert f"Seq Scan on {table}" not in plan, f"{sql}\n{plan}"
        # Nor walks the primary key filtering every row (a page ordered by id would),
        # unless matches are *dense*: then the walk finds a page's worth at once.
        if f"{table}_pkey" in plan and not dense:
            assert "Index Cond: (id " in plan, f"{sql}\n{plan}"
    text = "\n".join(plan for _, plan in found)
    for index in indexes:
        assert index in text, text


def changelist(model, term):
    url = reverse(f"admin:django_outbox_{model._meta.model_name}_changelist")
    return f"{url}?q={term}"


@pytest.mark.parametrize(
    ("model", "term", "indexes", "matches"),
    [
        (OutboxMessage, "message id", ["django_outbox_message_message_id_key"], 1),
        (OutboxMessage, "order:471", ["outbox_msg_key_prefix_idx"], 11),
        (OutboxMessage, "req-4710", ["outbox_msg_correlation_idx"], 1),
        (OutboxMessage, "no-such-thing", ["outbox_msg_key_prefix_idx"], 0),
        (InboxMessage, "evt-4711", ["inbox_msg_unique"], 1),
        (InboxMessage, "customer:471", ["inbox_msg_key_prefix_idx"], 11),
        (InboxMessage, "req-4711", ["inbox_msg_correlation_idx"], 1),
        (Job, "result id", ["django_outbox_job_result_id_key"], 1),
        (Job, "sync:4710", ["outbox_job_unique_lookup_idx"], 1),
        (Job, "shop.jobs.task_7", ["outbox_job_task_idx"], 100),
        (Job, "no-such-thing", ["outbox_job_task_idx"], 0),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else None,
)
def test_a_search_reads_its_indexes_not_the_table(
    admin_client, tables, model, term, indexes, matches
):
    """Given 20,000 rows, when an operator searches an id, a correlation id, the start
    of a key or of a task path, then the page, its probe and its count read indexes."""
    if term == "message id":
        term = str(OutboxMessage.objects.order_by("?").first().message_id)
    elif term == "result id":
        term = str(Job.objects.order_by("?").first().result_id)
    response, found = plans(admin_client, changelist(model, term), model._meta.db_table)
    assert len(response.context["cl"].result_list) == min(matches, 100)
    assert_reads_indexes(found, model._meta.db_table, *indexes, dense=matches >= 100)


def test_a_request_s_page_finds_its_replies_through_an_index(admin_client, tables):
    request = OutboxMessage.objects.get(correlation_id="req-4710")
    reply = InboxMessage.objects.create(
        source="replies",
        message_id="reply-1",
        type="order.paid.reply",
        payload={},
        correlation_id="req-4710",
    )
    url = reverse("admin:django_outbox_outboxmessage_change", args=[request.pk])
    response, found = plans(admin_client, url, "django_outbox_inbox")
    assert f"inbox #{reply.pk}" in response.text
    assert_reads_indexes(found, "django_outbox_inbox", "inbox_msg_correlation_idx")


def test_a_reply_s_page_finds_its_request_through_an_index(admin_client, tables):
    request = OutboxMessage.objects.get(correlation_id="req-4713")
    reply = InboxMessage.objects.create(
        source="replies",
        message_id=str(uuid.uuid4()),
        type="t.reply",
        payload={},
        correlation_id="req-4713",
    )
    url = reverse("admin:django_outbox_inboxmessage_change", args=[reply.pk])
    response, found = plans(admin_client, url, "django_outbox_message")
    assert f"outbox #{request.pk}" in response.text
    assert_reads_indexes(found, "django_outbox_message", "outbox_msg_correlation_idx")


@pytest.mark.parametrize(
    ("model", "filters", "index"),
    [
        (OutboxMessage, "uncertain__exact=1", "outbox_msg_troubled_idx"),
        (OutboxMessage, "attempts=6%2B", "outbox_msg_troubled_idx"),
        (OutboxMessage, "attempts=2-5", "outbox_msg_troubled_idx"),
        (OutboxMessage, "has_error=yes", "outbox_msg_troubled_idx"),
        (InboxMessage, "attempts=6%2B", "inbox_msg_troubled_idx"),
        (InboxMessage, "has_error=yes", "inbox_msg_troubled_idx"),
        (InboxMessage, "gap=waiting", "inbox_msg_gap_idx"),
        (Job, "attempts=2-5", "outbox_job_troubled_idx"),
        (Job, "has_error=yes", "outbox_job_troubled_idx"),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else None,
)
def test_a_filter_few_rows_match_reads_the_failed_rows_only(
    admin_client, tables, model, filters, index
):
    """Given 20,000 rows none of which failed, a filter on errors, attempts or
    uncertainty reads the partial index of the rows that failed, once (the page found
    the end: nothing is counted)."""
    url = reverse(f"admin:django_outbox_{model._meta.model_name}_changelist") + "?" + filters
    response, found = plans(admin_client, url, model._meta.db_table)
    assert list(response.context["cl"].result_list) == []
    assert not [sql for sql, _ in found if "COUNT(" in sql]
    assert_reads_indexes(found, model._meta.db_table, index)
