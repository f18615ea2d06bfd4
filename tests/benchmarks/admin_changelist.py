"""Admin pages over a large outbox table on PostgreSQL: how long each takes to open.

    python -m tests.benchmarks.admin_changelist --rows 5000000

Creates a database of its own (ADMIN_BENCH_DATABASE_URL, default the local server's
``django_outbox_admin_bench``; an existing one of that name is dropped first),
migrates it and fills the outbox table with ``--rows`` messages in one
``INSERT … SELECT FROM generate_series``: mostly sent, 1 % failed with a traceback
in ``last_error``, 1 % waiting (half of the keyed ones parked behind a failed key),
0.5 % cancelled, 0.1 % being sent; half of them keyed, five types, three
destinations, created over the last 30 days. Then ``VACUUM ANALYZE`` (what
autovacuum would have done to a table this old), and each page is opened through
Django's test client, logged in as a superuser: once to warm up, then ``--repeat``
times. Prints a Markdown table of the best and median times in milliseconds, the
number of queries and the slowest of them, and the SQL of the slowest query of any
page that took a second or more. The database is dropped at the end unless
``--keep`` is given (to EXPLAIN its queries by hand).

Figures are printed, never asserted (docs/benchmarks.md records them).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import date, timedelta
from urllib.parse import urlencode

BENCH_DB = os.environ.get(
    "ADMIN_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/django_outbox_admin_bench"
)
#: A page at least this slow (median, milliseconds) has its slowest query printed.
SLOW_MS = 1000

os.environ["DATABASE_URL"] = BENCH_DB
# Production-like: no per-query bookkeeping, no dispatch, no broker.
os.environ["DEBUG"] = "0"
os.environ["OUTBOX_DISPATCH"] = "none"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

FILL = """
INSERT INTO django_outbox_message
    (message_id, type, destination, payload, headers, key, sequence, correlation_id,
     state, attempts, available_at, locked_until, lock_token, claimed_by, last_error,
     created_at, sent_at, finished_at, uncertain, blocked, blocking)
SELECT gen_random_uuid(),
       (ARRAY['order.created', 'order.paid', 'invoice.sent', 'customer.updated',
              'shipment.dispatched'])[1 + g %% 5],
       (ARRAY['default', 'billing', 'search'])[1 + g %% 3],
       jsonb_build_object('order_id', g, 'customer', 'customer-' || g %% 10000,
                          'total_cents', 1000 + g %% 997, 'currency', 'EUR'),
       '{}',
       key, CASE WHEN key IS NOT NULL THEN g / 2 / 50000 + 1 END,
       CASE WHEN g %% 3 = 0 THEN 'req-' || g END,
       state,
       CASE state WHEN 'send_error' THEN 5 WHEN 'should_be_sent' THEN 0 ELSE 1 END,
       created,
       CASE WHEN state = 'sending' THEN now() + interval '60 seconds' END,
       CASE WHEN state = 'sending' THEN gen_random_uuid() END,
       CASE WHEN state = 'sending' THEN gen_random_uuid() END,
       CASE WHEN state = 'send_error' THEN
           E'Traceback (most recent call last):\\n'
           || E'  File "django_outbox/outbox/transports/http.py", line 120, in publish\\n'
           || E'    response.raise_for_status()\\n'
           || 'httpx.HTTPStatusError: Server error ''503 Service Unavailable'' for url '
           || '''https://hooks.example.com/orders/' || g || ''''
       ELSE '' END,
       created,
       CASE WHEN state = 'sent' THEN created + interval '200 milliseconds' END,
       CASE WHEN state IN ('sent', 'cancelled') THEN created + interval '200 milliseconds' END,
       false,
       state = 'should_be_sent' AND key IS NOT NULL AND g %% 1000 < 15,
       state = 'send_error' AND key IS NOT NULL
FROM (
    SELECT g,
           CASE WHEN g %% 2 = 0 THEN 'order:' || (g / 2 %% 50000) END AS key,
           CASE WHEN g %% 1000 < 10 THEN 'send_error'
                WHEN g %% 1000 < 20 THEN 'should_be_sent'
                WHEN g %% 1000 < 21 THEN 'sending'
                WHEN g %% 1000 < 26 THEN 'cancelled'
                ELSE 'sent' END AS state,
           now() - interval '30 days' + interval '30 days' * (g::float8 / %(rows)s) AS created
    FROM generate_series(1, %(rows)s) AS g
) AS generated
"""


def recreate_database() -> None:
    import psycopg

    name = BENCH_DB.rsplit("/", 1)[1]
    with psycopg.connect(BENCH_DB.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database() -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    name = BENCH_DB.rsplit("/", 1)[1]
    with psycopg.connect(BENCH_DB.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def fill(rows: int) -> float:
    """Insert *rows* messages and VACUUM ANALYZE the table; return the seconds it took."""
    from django.db import connection

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(FILL, {"rows": rows})
        cursor.execute("VACUUM ANALYZE django_outbox_message")
    return time.perf_counter() - started


def pages() -> list[tuple[str, str]]:
    """(label, URL) of each page timed, as an operator reaches them from the list."""
    from django.urls import reverse
    from django.utils import timezone

    from django_outbox.outbox.models import OutboxMessage, OutboxState

    changelist = reverse("admin:django_outbox_outboxmessage_changelist")
    # The "Past 7 days" link of the created filter, built as DateFieldListFilter does.
    today = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    past_week = {
        "created_at__gte": str(today - timedelta(days=7)),
        "created_at__lt": str(today + timedelta(days=1)),
    }
    failed = (
        OutboxMessage.objects.filter(state=OutboxState.SEND_ERROR, key__isnull=False)
        .values_list("pk", flat=True)
        .first()
    )
    return [
        ("list, unfiltered", changelist),
        ("list, state = send error", f"{changelist}?state__exact=send_error"),
        ("list, search key prefix 'order:4711'", f"{changelist}?{urlencode({'q': 'order:4711'})}"),
        ("list, has an error", f"{changelist}?has_error=yes"),
        ("list, created in the past 7 days", f"{changelist}?{urlencode(past_week)}"),
        (
            "a failed keyed message's page",
            reverse("admin:django_outbox_outboxmessage_change", args=[failed]),
        ),
    ]


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000, help="Messages in the table.")
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
        parser.error(f"ADMIN_BENCH_DATABASE_URL must be PostgreSQL, not {BENCH_DB}")

    recreate_database()
    try:
        import django

        django.setup()
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.test import Client

        call_command("migrate", verbosity=0)
        filled = fill(args.rows)
        client = Client()
        client.force_login(User.objects.create_superuser("bench", "bench@example.com", None))
        results = []
        for label, url in pages():
            samples, queries = time_page(client, url, args.repeat)
            slowest = max(queries, key=lambda q: float(q["time"]))
            results.append((label, url, samples, queries, slowest))
    finally:
        if not args.keep:
            drop_database()

    print(
        f"\n{date.today()} · {os.cpu_count()} cores · Python {platform.python_version()}, "
        f"Django {django.get_version()} · {args.rows:,} rows (filled and analysed in "
        f"{filled:.0f} s) · best and median of {args.repeat}\n"
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
        if statistics.median(samples) >= SLOW_MS:
            print(f"{label} ({url}) took a second or more; its slowest query:")
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
