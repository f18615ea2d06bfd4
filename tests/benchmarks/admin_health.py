"""The health page and the health probe over large tables on PostgreSQL: how long each
takes to answer.

    python -m tests.benchmarks.admin_health --rows 5000000

Creates a database of its own (HEALTH_BENCH_DATABASE_URL, default the local server's
``django_outbox_health_bench``; an existing one of that name is dropped first),
migrates it and fills each of the three tables (outbox, inbox, jobs) with ``--rows``
rows in one ``INSERT … SELECT FROM generate_series`` each: mostly finished, 1 %
failed (three kinds of error per part), 1 % waiting (some of them parked behind a
failed key, or waiting for an inbox gap), 0.5 % cancelled or skipped, 0.1 % held by
workers (one of them dead), created over the last 30 days; then an hour of per-minute
counts, a hundred open job batches, and ``VACUUM ANALYZE`` (what autovacuum would have
done to tables this old). The health page (logged in as a superuser) and the probe (a
staff session) are then opened through Django's test client: once to warm up, then
``--repeat`` times. Prints a Markdown table of the best and median times in
milliseconds, the number of queries and the slowest of them, and the SQL of the
slowest query of a page over its target. The database is dropped at the end unless
``--keep`` is given (to EXPLAIN its queries by hand).

Figures are printed, never asserted (docs/benchmarks.md records them). Target: the
page under 300 ms.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import uuid
from datetime import date

from tests.benchmarks import common

BENCH_DB = os.environ.get(
    "HEALTH_BENCH_DATABASE_URL",
    "postgres://postgres@127.0.0.1:5432/django_outbox_health_bench",
)
#: The page's target, in milliseconds (median).
TARGET_MS = 300

os.environ["DATABASE_URL"] = BENCH_DB
# Production-like: no per-query bookkeeping, no dispatch, no broker.
os.environ["DEBUG"] = "0"
os.environ["OUTBOX_DISPATCH"] = "none"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

#: Workers holding rows: three alive, one dead a minute ago.
WORKERS = [
    (uuid.UUID(int=1), "bench:1 outbox", 0),
    (uuid.UUID(int=2), "bench:2 inbox", 0),
    (uuid.UUID(int=3), "bench:3 jobs default", 0),
    (uuid.UUID(int=4), "bench:4 jobs default", 60),
]

#: Each row's share, by ``g % 1000``: failed, waiting, held, cancelled/skipped, finished.
STATES = """CASE WHEN g %% 1000 < 10 THEN 'failed' WHEN g %% 1000 < 20 THEN 'waiting'
                WHEN g %% 1000 < 21 THEN 'held' WHEN g %% 1000 < 26 THEN 'dropped'
                ELSE 'done' END"""
CREATED = "now() - interval '30 days' + interval '30 days' * (g::float8 / %(rows)s)"
#: Three kinds of error per part, the third with a number that differs per row.
ERRORS = """(ARRAY['HTTP 503', 'connection refused', 'order ' || g || ' not found'])[1 + g %% 3]"""

OUTBOX = f"""
INSERT INTO django_outbox_message
    (message_id, type, destination, payload, headers, key, sequence, correlation_id,
     state, attempts, available_at, locked_until, lock_token, claimed_by, attempt_open,
     unclean_end, last_error, created_at, sent_at, finished_at, attempted_at, uncertain,
     blocked, blocking)
SELECT gen_random_uuid(), 'order.created', (ARRAY['default', 'billing', 'search'])[1 + g %% 3],
       jsonb_build_object('order_id', g), '{{}}',
       key, CASE WHEN key IS NOT NULL THEN g END, NULL,
       CASE kind WHEN 'failed' THEN 'send_error' WHEN 'waiting' THEN 'should_be_sent'
                 WHEN 'held' THEN 'sending' WHEN 'dropped' THEN 'cancelled' ELSE 'sent' END,
       CASE kind WHEN 'failed' THEN 5 WHEN 'waiting' THEN 0 ELSE 1 END,
       CASE kind WHEN 'waiting' THEN now() - make_interval(secs => g %% 90) ELSE created END,
       CASE kind WHEN 'held' THEN now() + interval '60 seconds' END,
       CASE kind WHEN 'held' THEN gen_random_uuid() END,
       CASE kind WHEN 'held' THEN '{WORKERS[0][0]}'::uuid END,
       kind = 'held', false,
       CASE kind WHEN 'failed' THEN {ERRORS} ELSE '' END,
       created,
       CASE kind WHEN 'done' THEN created + interval '200 milliseconds' END,
       CASE WHEN kind IN ('done', 'dropped') THEN created + interval '200 milliseconds' END,
       CASE WHEN kind IN ('failed', 'held', 'done') THEN created END,
       kind = 'failed' AND g %% 10000 = 0,
       kind = 'waiting' AND key IS NOT NULL AND g %% 1000 < 15,
       kind = 'failed' AND key IS NOT NULL
FROM (SELECT g, {STATES} AS kind, {CREATED} AS created,
             CASE WHEN g %% 2 = 0 THEN 'order:' || (g / 2 %% 50000) END AS key
      FROM generate_series(1, %(rows)s) AS g) AS generated
"""

INBOX = f"""
INSERT INTO django_outbox_inbox
    (source, message_id, type, payload, headers, key, sequence, correlation_id, state,
     attempts, available_at, locked_until, lock_token, claimed_by, attempt_open, unclean_end,
     last_error, received_at, handled_at, attempted_at, raw_body, traceback)
SELECT (ARRAY['shop', 'billing', 'crm'])[1 + g %% 3], g::text, 'order.paid',
       jsonb_build_object('order_id', g), '{{}}',
       key, CASE WHEN key IS NOT NULL THEN g END, NULL,
       CASE kind WHEN 'failed' THEN 'handle_error' WHEN 'dropped' THEN 'skipped'
                 WHEN 'done' THEN 'handled' ELSE 'should_be_handled' END,
       CASE kind WHEN 'waiting' THEN 0 ELSE 1 END,
       CASE WHEN kind = 'waiting' AND key IS NOT NULL AND g %% 1000 < 12
                 THEN now() + interval '5 minutes'
            WHEN kind IN ('waiting', 'held') THEN now() - make_interval(secs => g %% 90)
            ELSE created END,
       CASE kind WHEN 'held' THEN now() + interval '60 seconds' END,
       CASE kind WHEN 'held' THEN gen_random_uuid() END,
       CASE kind WHEN 'held' THEN '{WORKERS[1][0]}'::uuid END,
       kind = 'held', false,
       CASE WHEN kind = 'failed' THEN 'ValueError: ' || {ERRORS}
            WHEN kind = 'waiting' AND key IS NOT NULL AND g %% 1000 < 12
                 THEN 'waiting for sequence ' || (g - 1) || ' of key ' || key
            ELSE '' END,
       created,
       CASE WHEN kind IN ('done', 'dropped') THEN created + interval '150 milliseconds' END,
       CASE WHEN kind IN ('failed', 'held', 'done') THEN created END,
       '', ''
FROM (SELECT g, {STATES} AS kind, {CREATED} AS created,
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
       (ARRAY['shop.jobs.send_receipt', 'shop.jobs.sync_customer', 'shop.jobs.bill'])[1 + g %% 3],
       'default', (ARRAY['default', 'emails'])[1 + g %% 2], 0, '[]', '{{}}',
       CASE kind WHEN 'failed' THEN 'FAILED' WHEN 'dropped' THEN 'FAILED'
                 WHEN 'held' THEN 'RUNNING' WHEN 'done' THEN 'SUCCESSFUL' ELSE 'READY' END,
       3, NULL,
       CASE kind WHEN 'failed' THEN jsonb_build_array(jsonb_build_object(
           'exception_class_path',
           (ARRAY['builtins.ValueError', 'httpx.ConnectError', 'shop.errors.Declined'])[1 + g %% 3],
           'traceback', 'Traceback (most recent call last): ...', 'attempt', 3))
           ELSE '[]'::jsonb END,
       '[]', CASE WHEN kind <> 'waiting' THEN created END, NULL,
       CASE WHEN kind <> 'waiting' THEN created END, NULL,
       serial, CASE WHEN serial IS NOT NULL THEN g END,
       kind = 'waiting' AND serial IS NOT NULL,
       kind = 'failed' AND serial IS NOT NULL,
       NULL,
       CASE kind WHEN 'dropped' THEN 'cancelled' ELSE '' END,
       CASE kind WHEN 'waiting' THEN 0 WHEN 'failed' THEN 3 ELSE 1 END,
       CASE kind WHEN 'waiting' THEN now() - make_interval(secs => g %% 90) ELSE created END,
       CASE kind WHEN 'held' THEN now() + interval '60 seconds' END,
       CASE kind WHEN 'held' THEN gen_random_uuid() END,
       CASE kind WHEN 'held' THEN
           (ARRAY['{WORKERS[2][0]}', '{WORKERS[3][0]}'])[1 + g %% 2]::uuid END,
       kind = 'held', false,
       CASE kind WHEN 'failed' THEN 'Error: ' || {ERRORS}
                 WHEN 'dropped' THEN 'cancelled before it ran' ELSE '' END,
       created,
       CASE WHEN kind IN ('failed', 'dropped', 'done') THEN created + interval '1 second' END,
       '', false
FROM (SELECT g, {STATES} AS kind, {CREATED} AS created,
             CASE WHEN g %% 1000 BETWEEN 10 AND 14 THEN 'invoice:' || (g %% 997) END AS serial
      FROM generate_series(1, %(rows)s) AS g) AS generated
"""

#: An hour of per-minute counts: thousands done a minute, a few failures.
MINUTES = """
INSERT INTO django_outbox_minute_count (part, minute, event, count)
SELECT part, date_trunc('minute', now()) - make_interval(mins => m), event,
       CASE event WHEN 'done' THEN 3000 + (m * 37) % 900 ELSE (m * 7) % 11 END
FROM unnest(ARRAY['outbox', 'inbox', 'jobs']) AS part,
     unnest(ARRAY['done', 'retried', 'dead']) AS event,
     generate_series(0, 59) AS m
"""


def fill(rows: int) -> float:
    """Fill the three tables, the workers, the batches and the per-minute counts, then
    VACUUM ANALYZE; return the seconds it took."""
    from django.db import connection
    from django.utils import timezone

    from django_outbox.engine.models import SweepMark, Worker
    from django_outbox.jobs.models import JobBatch

    started = time.perf_counter()
    now = timezone.now()
    Worker.objects.bulk_create(
        Worker(
            id=pk,
            name=name,
            started_at=now,
            heartbeat_at=now - timezone.timedelta(seconds=silent),
            healthy_since=now - timezone.timedelta(seconds=silent + 600),
        )
        for pk, name, silent in WORKERS
    )
    SweepMark.objects.bulk_create(
        SweepMark(part=part, last_run_at=now, ran_by="bench:1")
        for part in ("outbox", "inbox", "jobs")
    )
    JobBatch.objects.bulk_create(JobBatch(total=10) for _ in range(100))
    with connection.cursor() as cursor:
        for statement in (OUTBOX, INBOX, JOBS):
            cursor.execute(statement, {"rows": rows})
        cursor.execute(MINUTES)
        for table in ("django_outbox_message", "django_outbox_inbox", "django_outbox_job"):
            cursor.execute(f"VACUUM ANALYZE {table}")
    return time.perf_counter() - started


def time_url(client, url: str, repeat: int) -> tuple[list[float], list[dict[str, str]]]:
    """Milliseconds of *repeat* loads after one warm-up, and the warm-up's queries."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code in (200, 503), (url, response.status_code)
    captured = queries.captured_queries
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(url)
        samples.append((time.perf_counter() - started) * 1000)
    return samples, captured


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000, help="Rows in each table.")
    parser.add_argument("--repeat", type=int, default=5, help="Timed loads of each page.")
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
        parser.error(f"HEALTH_BENCH_DATABASE_URL must be PostgreSQL, not {BENCH_DB}")

    common.recreate_database(BENCH_DB)
    try:
        import django

        django.setup()
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.test import Client
        from django.urls import reverse

        call_command("migrate", verbosity=0)
        filled = fill(args.rows)
        client = Client()
        client.force_login(User.objects.create_superuser("bench", "bench@example.com", None))
        urls = [
            ("health page", reverse("admin:django_outbox_health_changelist")),
            ("health probe (JSON)", reverse("django_outbox_health:health")),
        ]
        results = []
        for label, url in urls:
            samples, queries = time_url(client, url, args.repeat)
            slowest = max(queries, key=lambda q: float(q["time"]))
            results.append((label, url, samples, queries, slowest))
    finally:
        if not args.keep:
            common.drop_database(BENCH_DB)

    print(
        f"\n{date.today()} · {os.cpu_count()} cores · Python {platform.python_version()}, "
        f"Django {django.get_version()} · {args.rows:,} rows in each of the three tables "
        f"(filled and analysed in {filled:.0f} s) · best and median of {args.repeat}\n"
    )
    print("| page | best ms | median ms | queries | slowest query ms |")
    print("|---|---:|---:|---:|---:|")
    for label, _, samples, queries, slowest in results:
        print(
            f"| {label} | {min(samples):,.0f} | {statistics.median(samples):,.0f} "
            f"| {len(queries)} | {float(slowest['time']) * 1000:,.0f} |"
        )
    print()
    for label, url, samples, _, slowest in results:
        median = statistics.median(samples)
        verdict = "met" if median < TARGET_MS else "MISSED"
        print(f"{label}: median {median:,.0f} ms, target under {TARGET_MS} ms: {verdict}")
        if median >= TARGET_MS:
            print(f"    its slowest query ({url}):\n    {slowest['sql']}\n")
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
