"""The admin of the three parts over large tables on PostgreSQL: how long each list,
filter, search and row page takes to open, and how long a bulk action holds a request.

    python -m tests.benchmarks.admin_changelist --rows 5000000

Creates a database of its own (ADMIN_BENCH_DATABASE_URL, default the local server's
``django_outbox_admin_bench``; an existing one of that name is dropped first),
migrates it and fills each table with ``--rows`` rows in one ``INSERT … SELECT FROM
generate_series``, created over the last 30 days:

- outbox: mostly sent, 1 % failed with a traceback, 1 % waiting (some parked behind a
  failed key), 0.5 % cancelled, 0.1 % being sent; half keyed over 50,000 keys, five
  types, three destinations; a third with a correlation id, one in thirty a request
  (``reply_to``);
- inbox: three sources (one of them the requests' replies, correlated), mostly
  handled, 1 % failed, 1 % waiting (some for a gap of a strict key), 0.5 % skipped;
  half keyed over 50,000 keys;
- jobs: eight task paths on three queues, mostly successful, 1 % failed with their
  errors, 1 % ready, 0.1 % running; one in ten with a unique key.

Then ``VACUUM ANALYZE`` (what autovacuum would have done to tables this old) and the
sweeps are stamped as running. Each page is opened through Django's test client,
logged in as a superuser: once to warm up, then ``--repeat`` times. The pages: each
part's list, every choice of each of its filters (read from the list's own filter
specs), the searches (an exact id, a correlation id, a key prefix, a task path
prefix, ``type:``), a failed row's page, a request's page (its replies) and a reply's
page (its request). Then the bulk actions, on ``--bulk-rows`` rows each (default
100,000, at most a quarter of ``--rows``): a requeue of failed outbox messages, a retry
of failed jobs and a release of inbox gaps, each selected as "all matching" a filtered
list and driven as the admin's progress page drives it (one request per step): the
number of requests, the longest and the total time.

Prints Markdown tables (best and median milliseconds, queries, slowest query) and the
SQL of the slowest query of a page whose median is over ``TARGET_MS``. The database is
dropped at the end unless ``--keep`` is given (to EXPLAIN its queries by hand).

Figures are printed, never asserted (docs/benchmarks.md records them). Targets
(issue 15): every page under 300 ms, no bulk request over 10 s.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import time
from datetime import date
from urllib.parse import urlencode

from tests.benchmarks import common

BENCH_DB = os.environ.get(
    "ADMIN_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/django_outbox_admin_bench"
)
#: A page's target, in milliseconds (median); slower ones have their slowest query printed.
TARGET_MS = 300
#: A bulk action's longest request, in seconds.
BULK_TARGET_S = 10

os.environ["DATABASE_URL"] = BENCH_DB
# Production-like: no per-query bookkeeping, no dispatch, no broker.
os.environ["DEBUG"] = "0"
os.environ["OUTBOX_DISPATCH"] = "none"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

#: When a row of ``g`` was created: spread over the last 30 days, in id order.
CREATED = "now() - interval '30 days' + interval '30 days' * (g::float8 / %(rows)s)"
#: Each row's share, by ``g % 1000``.
KIND = """CASE WHEN g %% 1000 < 10 THEN 'failed' WHEN g %% 1000 < 20 THEN 'waiting'
               WHEN g %% 1000 < 21 THEN 'held' WHEN g %% 1000 < 26 THEN 'dropped'
               ELSE 'done' END"""
TRACEBACK = """E'Traceback (most recent call last):\\n'
    || E'  File "app/integrations.py", line 120, in call\\n'
    || E'    response.raise_for_status()\\n'
    || 'httpx.HTTPStatusError: Server error ''503 Service Unavailable'' for url '
    || '''https://hooks.example.com/orders/' || g || ''''"""

OUTBOX = f"""
INSERT INTO django_outbox_message
    (message_id, type, destination, payload, headers, key, sequence, correlation_id,
     state, attempts, available_at, locked_until, lock_token, claimed_by, last_error,
     created_at, sent_at, finished_at, uncertain, blocked, blocking, attempt_open,
     unclean_end)
SELECT gen_random_uuid(),
       (ARRAY['order.created', 'order.paid', 'invoice.sent', 'customer.updated',
              'shipment.dispatched'])[1 + g %% 5],
       (ARRAY['default', 'billing', 'search'])[1 + g %% 3],
       jsonb_build_object('order_id', g, 'customer', 'customer-' || g %% 10000,
                          'total_cents', 1000 + g %% 997, 'currency', 'EUR'),
       CASE WHEN g %% 30 = 0 THEN '{{"outbox-reply-to": "replies"}}'::jsonb
            ELSE '{{}}'::jsonb END,
       key, CASE WHEN key IS NOT NULL THEN g / 2 / 50000 + 1 END,
       CASE WHEN g %% 3 = 0 THEN 'req-' || g END,
       state,
       CASE state WHEN 'send_error' THEN 5 WHEN 'should_be_sent' THEN 0 ELSE 1 END,
       created,
       CASE WHEN state = 'sending' THEN now() + interval '60 seconds' END,
       CASE WHEN state = 'sending' THEN gen_random_uuid() END,
       CASE WHEN state = 'sending' THEN gen_random_uuid() END,
       CASE WHEN state = 'send_error' THEN {TRACEBACK} ELSE '' END,
       created,
       CASE WHEN state = 'sent' THEN created + interval '200 milliseconds' END,
       CASE WHEN state IN ('sent', 'cancelled') THEN created + interval '200 milliseconds' END,
       false,
       state = 'should_be_sent' AND key IS NOT NULL AND g %% 1000 < 15,
       state = 'send_error' AND key IS NOT NULL,
       false, false
FROM (
    SELECT g,
           CASE WHEN g %% 2 = 0 THEN 'order:' || (g / 2 %% 50000) END AS key,
           CASE {KIND} WHEN 'failed' THEN 'send_error' WHEN 'waiting' THEN 'should_be_sent'
                WHEN 'held' THEN 'sending' WHEN 'dropped' THEN 'cancelled'
                ELSE 'sent' END AS state,
           {CREATED} AS created
    FROM generate_series(1, %(rows)s) AS g
) AS generated
"""

INBOX = f"""
INSERT INTO django_outbox_inbox
    (source, message_id, type, payload, headers, key, sequence, correlation_id, state,
     attempts, available_at, locked_until, lock_token, claimed_by, attempt_open, unclean_end,
     last_error, received_at, handled_at, attempted_at, raw_body, traceback)
SELECT source, 'evt-' || g,
       (ARRAY['order.paid', 'order.refunded', 'customer.created', 'invoice.due',
              'stock.changed'])[1 + g %% 5],
       jsonb_build_object('order_id', g), '{{}}',
       key, CASE WHEN key IS NOT NULL THEN g / 2 / 50000 + 1 END,
       -- The replies source answers the outbox's requests (g %% 30 = 0 there).
       -- (30, 60, 90, …: the first tenth of the rows answer a request each).
       CASE WHEN source = 'replies' THEN 'req-' || (30 * ((g - 2) / 3 + 1)) END,
       CASE kind WHEN 'failed' THEN 'handle_error' WHEN 'dropped' THEN 'skipped'
                 WHEN 'done' THEN 'handled' ELSE 'should_be_handled' END,
       CASE kind WHEN 'failed' THEN 5 WHEN 'waiting' THEN 0 ELSE 1 END,
       created,
       CASE kind WHEN 'held' THEN now() + interval '60 seconds' END,
       CASE kind WHEN 'held' THEN gen_random_uuid() END,
       CASE kind WHEN 'held' THEN gen_random_uuid() END,
       kind = 'held', false,
       CASE WHEN kind = 'failed' THEN {TRACEBACK}
            WHEN kind = 'waiting' AND key IS NOT NULL AND g %% 1000 < 15
                 THEN 'waiting for sequence ' || (g / 2 / 50000) || ' of key ' || key
            ELSE '' END,
       created,
       CASE WHEN kind IN ('done', 'dropped') THEN created + interval '150 milliseconds' END,
       CASE WHEN kind IN ('failed', 'held', 'done') THEN created END,
       '', CASE WHEN kind = 'failed' THEN {TRACEBACK} ELSE '' END
FROM (SELECT g, {KIND} AS kind, {CREATED} AS created,
             (ARRAY['orders', 'partner', 'replies'])[1 + g %% 3] AS source,
             CASE WHEN g %% 2 = 0 THEN 'customer:' || (g / 2 %% 50000) END AS key
      FROM generate_series(1, %(rows)s) AS g) AS generated
"""

JOBS = f"""
INSERT INTO django_outbox_job
    (result_id, task_path, backend, queue_name, priority, args, kwargs, state, max_attempts,
     return_value, errors, worker_ids, started_at, run_after, last_attempted_at, unique_key,
     serial_key, sequence, blocked, blocking, batch_id, resolution, attempts, available_at,
     locked_until, lock_token, claimed_by, attempt_open, unclean_end, last_error, created_at,
     finished_at, traceparent, cancel_requested)
SELECT gen_random_uuid(),
       (ARRAY['shop.jobs.send_receipt', 'shop.jobs.sync_customer', 'shop.jobs.bill',
              'shop.jobs.export', 'shop.jobs.reindex', 'mail.jobs.digest',
              'mail.jobs.bounce', 'reports.jobs.daily'])[1 + g %% 8],
       'default', (ARRAY['default', 'emails', 'reports'])[1 + g %% 3], 0,
       jsonb_build_array(g), '{{}}',
       CASE kind WHEN 'failed' THEN 'FAILED' WHEN 'dropped' THEN 'FAILED'
                 WHEN 'held' THEN 'RUNNING' WHEN 'done' THEN 'SUCCESSFUL' ELSE 'READY' END,
       3, CASE kind WHEN 'done' THEN to_jsonb(g) END,
       CASE kind WHEN 'failed' THEN jsonb_build_array(jsonb_build_object(
           'exception_class_path', 'httpx.HTTPStatusError', 'traceback', 'Traceback …',
           'attempt', 3)) ELSE '[]'::jsonb END,
       '[]', CASE WHEN kind <> 'waiting' THEN created END, NULL,
       CASE WHEN kind <> 'waiting' THEN created END,
       CASE WHEN g %% 10 = 0 THEN 'sync:' || g END,
       NULL, NULL, false, false, NULL,
       CASE kind WHEN 'dropped' THEN 'cancelled' ELSE '' END,
       CASE kind WHEN 'waiting' THEN 0 WHEN 'failed' THEN 3 ELSE 1 END,
       created,
       CASE kind WHEN 'held' THEN now() + interval '60 seconds' END,
       CASE kind WHEN 'held' THEN gen_random_uuid() END,
       CASE kind WHEN 'held' THEN gen_random_uuid() END,
       kind = 'held', false,
       CASE kind WHEN 'failed' THEN 'httpx.HTTPStatusError: 503'
                 WHEN 'dropped' THEN 'cancelled before it ran' ELSE '' END,
       created,
       CASE WHEN kind IN ('done', 'failed', 'dropped') THEN created + interval '1 second' END,
       '', false
FROM (SELECT g, {KIND} AS kind, {CREATED} AS created
      FROM generate_series(1, %(rows)s) AS g) AS generated
"""

#: The rows each bulk action is timed on: *bulk* of them, newest first, made failed (or
#: waiting for a gap) and marked so a filtered list selects exactly them.
BULK = {
    "outbox": """
UPDATE django_outbox_message SET state = 'send_error', type = 'bulk.requeue', attempts = 5,
       last_error = 'HTTP 503', sent_at = NULL, finished_at = NULL
WHERE id IN (SELECT id FROM django_outbox_message WHERE state = 'sent'
             ORDER BY id DESC LIMIT %(bulk)s)""",
    "jobs": """
UPDATE django_outbox_job SET state = 'FAILED', task_path = 'bench.jobs.bulk_retry',
       last_error = 'httpx.HTTPStatusError: 503', attempts = 3, return_value = NULL
WHERE id IN (SELECT id FROM django_outbox_job WHERE state = 'SUCCESSFUL'
             ORDER BY id DESC LIMIT %(bulk)s)""",
    "inbox": """
UPDATE django_outbox_inbox SET state = 'should_be_handled', handled_at = NULL,
       source = 'bulk', key = 'gap:' || id, sequence = 5, attempts = 0,
       last_error = 'waiting for sequence 4 of key gap:' || id
WHERE id IN (SELECT id FROM django_outbox_inbox WHERE state = 'handled'
             ORDER BY id DESC LIMIT %(bulk)s)""",
}


TABLES = ("django_outbox_message", "django_outbox_inbox", "django_outbox_job")


def fill(rows: int, bulk: int) -> float:
    """Fill the three tables and mark the bulk actions' rows, VACUUM ANALYZE, stamp the
    sweeps; return the seconds it took."""
    from django.db import connection
    from django.utils import timezone

    from django_outbox.engine.models import SweepMark

    started = time.perf_counter()
    with connection.cursor() as cursor:
        for statement in (OUTBOX, INBOX, JOBS):
            cursor.execute(statement, {"rows": rows})
        for statement in BULK.values():
            cursor.execute(statement, {"bulk": bulk})
        for table in TABLES:
            cursor.execute(f"VACUUM ANALYZE {table}")
    # The sweeps run (the lists warn when they do not, after a look at the table).
    SweepMark.objects.bulk_create(
        SweepMark(part=part, last_run_at=timezone.now(), ran_by="bench:1")
        for part in ("outbox", "inbox", "jobs")
    )
    return time.perf_counter() - started


def filter_pages(user, model: type, part: str, changelist: str) -> list[tuple[str, str]]:
    """(label, URL) of every choice of every filter of *model*'s list, from its own
    filter specs (the links an operator clicks)."""
    from django.contrib import admin
    from django.test import RequestFactory

    request = RequestFactory().get(changelist)
    request.user = user
    cl = admin.site._registry[model].get_changelist_instance(request)
    found = []
    for spec in cl.filter_specs:
        for choice in spec.choices(cl):
            query = choice["query_string"]
            if choice.get("selected") or query in ("?", ""):
                continue  # "All": the unfiltered list
            found.append((f"{part} filter: {spec.title} = {choice['display']}", changelist + query))
    return found


def pages(user) -> list[tuple[str, str]]:
    """(label, URL) of each page timed, as an operator reaches them."""
    from django.urls import reverse

    from django_outbox.jobs.models import Job, JobState
    from django_outbox.models import InboxMessage, InboxState, OutboxMessage, OutboxState

    def changelist(model: type) -> str:
        return reverse(f"admin:django_outbox_{model._meta.model_name}_changelist")

    def change(model: type, pk: int) -> str:
        return reverse(f"admin:django_outbox_{model._meta.model_name}_change", args=[pk])

    def search(model: type, term: str, **filters: str) -> str:
        return f"{changelist(model)}?{urlencode({'q': term, **filters})}"

    message = OutboxMessage.objects.order_by("pk")[OutboxMessage.objects.count() // 2 :][0]
    failed = (
        OutboxMessage.objects.filter(state=OutboxState.SEND_ERROR, key__isnull=False)
        .exclude(type="bulk.requeue")
        .first()
    )
    request = OutboxMessage.objects.get(correlation_id="req-300")  # sent with reply_to
    reply = InboxMessage.objects.filter(correlation_id=request.correlation_id).first()
    if reply is None:  # a reply for the request, as its replies source would bring
        reply = InboxMessage.objects.create(
            source="replies",
            message_id=f"reply-{request.pk}",
            type="order.created.reply",
            payload={},
            correlation_id=request.correlation_id,
            state=InboxState.HANDLED,
            finished_at=request.created_at,
        )
    inbox_failed = InboxMessage.objects.filter(state=InboxState.HANDLE_ERROR).first()
    received = InboxMessage.objects.filter(source="partner").order_by("pk").last()
    job = Job.objects.filter(state=JobState.SUCCESSFUL).order_by("pk").last()
    job_failed = Job.objects.filter(state=JobState.FAILED).exclude(resolution="cancelled").first()
    unique = Job.objects.filter(unique_key__isnull=False).order_by("pk").first()
    found = [
        ("outbox list, unfiltered", changelist(OutboxMessage)),
        *filter_pages(user, OutboxMessage, "outbox", changelist(OutboxMessage)),
        ("outbox search: a message id", search(OutboxMessage, str(message.message_id))),
        ("outbox search: a correlation id", search(OutboxMessage, "req-4710")),
        ("outbox search: a key prefix 'order:4711'", search(OutboxMessage, "order:4711")),
        ("outbox search: nothing matches", search(OutboxMessage, "no-such-key")),
        (
            "outbox search: type:order.paid, failed",
            search(OutboxMessage, "type:order.paid", state__exact="send_error"),
        ),
        ("outbox page: a failed keyed message", change(OutboxMessage, failed.pk)),
        ("outbox page: a request (its replies)", change(OutboxMessage, request.pk)),
        ("inbox list, unfiltered", changelist(InboxMessage)),
        *filter_pages(user, InboxMessage, "inbox", changelist(InboxMessage)),
        ("inbox search: a sender's message id", search(InboxMessage, received.message_id)),
        ("inbox search: a correlation id", search(InboxMessage, request.correlation_id)),
        ("inbox search: a key prefix 'customer:4711'", search(InboxMessage, "customer:4711")),
        ("inbox page: a failed message", change(InboxMessage, inbox_failed.pk)),
        ("inbox page: a reply (its request)", change(InboxMessage, reply.pk)),
        ("jobs list, unfiltered", changelist(Job)),
        *filter_pages(user, Job, "jobs", changelist(Job)),
        ("jobs search: a result id", search(Job, str(job.result_id))),
        ("jobs search: a unique key", search(Job, unique.unique_key)),
        ("jobs search: a task path prefix 'shop.jobs.b'", search(Job, "shop.jobs.b")),
        ("jobs page: a failed job", change(Job, job_failed.pk)),
    ]
    return found


def time_page(client, url: str, repeat: int) -> tuple[list[float], list[dict[str, str]]]:
    """Milliseconds of *repeat* loads after one warm-up, and the warm-up's queries."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    # Read now: the next request empties the connection's query log.
    captured = queries.captured_queries
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(url)
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    return samples, captured


def time_bulk(client, model: type, action: str, filters: dict[str, str]) -> list[float]:
    """Run *action* on every row of the list filtered by *filters*, confirmed, following
    its progress pages as the browser would; return the seconds each request took."""
    from django.urls import reverse

    url = reverse(f"admin:django_outbox_{model._meta.model_name}_changelist")
    url += "?" + urlencode(filters)
    before = model._default_manager.count()
    one = model._default_manager.values_list("pk", flat=True).first()
    data = {
        "action": action,
        "select_across": "1",
        "index": "0",
        "_selected_action": [one],
        "confirmed": "yes",
    }
    seconds = []
    while True:
        started = time.perf_counter()
        response = client.post(url, data)
        seconds.append(time.perf_counter() - started)
        if response.status_code != 200:
            break
        # The progress page: its form carries the next step.
        carried = dict(
            re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', response.text)
        )
        assert "bulk_after" in carried, response.text[:2000]
        data = {**carried, "_selected_action": [one]}
    assert response.status_code == 302, (url, response.status_code)
    assert model._default_manager.count() == before
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000, help="Rows in each table.")
    parser.add_argument("--repeat", type=int, default=5, help="Timed loads of each page.")
    parser.add_argument(
        "--bulk-rows",
        type=int,
        default=100_000,
        help="Rows each bulk action moves (at most a quarter of --rows).",
    )
    parser.add_argument(
        "--keep", action="store_true", help="Keep the database afterwards (for EXPLAIN)."
    )
    parser.add_argument(
        "--informational",
        action="store_true",
        help="A reduced run (make test): say that its figures are not the real ones.",
    )
    args = parser.parse_args()
    if not BENCH_DB.startswith(("postgres://", "postgresql://")):
        parser.error(f"ADMIN_BENCH_DATABASE_URL must be PostgreSQL, not {BENCH_DB}")
    bulk_rows = min(args.bulk_rows, args.rows // 4)

    common.recreate_database(BENCH_DB)
    try:
        import django

        django.setup()
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.test import Client

        from django_outbox.jobs.models import Job, JobState
        from django_outbox.models import InboxMessage, OutboxMessage

        call_command("migrate", verbosity=0)
        filled = fill(args.rows, bulk_rows)
        client = Client()
        user = User.objects.create_superuser("bench", "bench@example.com", None)
        client.force_login(user)
        results = []
        for label, url in pages(user):
            samples, queries = time_page(client, url, args.repeat)
            slowest = max(queries, key=lambda q: float(q["time"]))
            results.append((label, url, samples, queries, slowest))
        bulks = [
            (
                f"outbox: requeue {bulk_rows:,} failed messages",
                time_bulk(
                    client,
                    OutboxMessage,
                    "requeue_messages",
                    {"state__exact": "send_error", "q": "type:bulk.requeue"},
                ),
            ),
            (
                f"jobs: retry {bulk_rows:,} failed jobs",
                time_bulk(
                    client,
                    Job,
                    "retry_jobs",
                    {"state__exact": JobState.FAILED, "q": "bench.jobs.bulk_retry"},
                ),
            ),
            (
                f"inbox: release {bulk_rows:,} gaps",
                time_bulk(
                    client, InboxMessage, "release_gaps", {"gap": "waiting", "source": "bulk"}
                ),
            ),
        ]
    finally:
        if not args.keep:
            common.drop_database(BENCH_DB)

    print(
        f"\n{date.today()} · {os.cpu_count()} cores · Python {platform.python_version()}, "
        f"Django {django.get_version()} · {args.rows:,} rows per table (filled and analysed "
        f"in {filled:.0f} s) · best and median of {args.repeat}\n"
    )
    print("| page | best ms | median ms | queries | slowest query ms |")
    print("|---|---:|---:|---:|---:|")
    for label, _, samples, queries, slowest in results:
        print(
            f"| {label} | {min(samples):,.0f} | {statistics.median(samples):,.0f} "
            f"| {len(queries)} | {float(slowest['time']) * 1000:,.0f} |"
        )
    over = [r for r in results if statistics.median(r[2]) > TARGET_MS]
    print(f"\n{len(results) - len(over)} of {len(results)} pages under {TARGET_MS} ms (median).\n")
    print("| bulk action | requests | longest request s | total s |")
    print("|---|---:|---:|---:|")
    for label, seconds in bulks:
        print(f"| {label} | {len(seconds)} | {max(seconds):.1f} | {sum(seconds):.1f} |")
    longest = max(max(seconds) for _, seconds in bulks)
    print(f"\nLongest bulk request: {longest:.1f} s (target: under {BULK_TARGET_S} s).\n")
    for label, url, _, _, slowest in over:
        print(f"{label} ({url}) took over {TARGET_MS} ms; its slowest query:")
        print(f"    {slowest['sql']}\n")
    if args.informational:
        print(
            "Reduced run (make test): figures are informational; the real ones come from "
            "`make bench-admin` (docs/benchmarks.md)."
        )
    if args.keep:
        print(f"Database kept: {BENCH_DB}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
