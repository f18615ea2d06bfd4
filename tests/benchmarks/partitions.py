"""The three parts over many finished rows, partitioned by day and not: throughput,
the admin's lists, and the purge of one day's rows.

    python -m tests.benchmarks.partitions --rows 50000000 --days 7

For each layout (``plain``, then ``partitioned``), in a database of its own
(PARTITION_BENCH_DATABASE_URL, default the local server's
``django_outbox_partition_bench``, dropped and made again):

1. migrate; for ``partitioned``, ``engine.partitions.convert`` each table while it is
   empty, with a cut-over ``--days`` + 2 days back, so that the rows filled next land in
   day partitions (what a table partitioned a while ago looks like);
2. at 0 finished rows: the relay's, the inbox's and the jobs worker's throughput (each
   ``--items`` rows made due, then drained in-process by ``Relay``, ``receive_many`` +
   ``Inbox``, ``Jobs``; memory transport, the test project's no-op handler ``bench.noop``
   and its ``bench_noop`` task), and the median time
   of each part's admin list (first page, a superuser, Django's test client);
3. fill each table with ``--rows`` finished rows spread over the ``--days`` days before
   yesterday, in one ``INSERT … SELECT FROM generate_series`` each (the columns of
   ``admin_changelist``'s fill, every row done), the three tables at once, each with its
   secondary indexes dropped and built again afterwards, then ``VACUUM ANALYZE`` and a
   ``CHECKPOINT``;
4. the same figures again at ``--rows``;
5. the purge of the oldest day: ``purge_finished`` with the cut-off at the end of that
   day, timed, with the rows it removed (deleted in batches, or dropped with the
   partition).

Prints Markdown tables; nothing is asserted (docs/benchmarks.md records the figures).
The issue's bar: throughput and lists within 1.5x from 0 to 50 million rows, and the
purge of a day in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import date, timedelta

from tests.benchmarks import admin_changelist as filled
from tests.benchmarks import common

BENCH_DB = os.environ.get(
    "PARTITION_BENCH_DATABASE_URL",
    "postgres://postgres@127.0.0.1:5432/django_outbox_partition_bench",
)
os.environ["DATABASE_URL"] = BENCH_DB
os.environ["DEBUG"] = "0"
os.environ["OUTBOX_SETTINGS_JSON"] = json.dumps(
    {
        "OUTBOX": {"DESTINATIONS": {"default": {"TRANSPORT": "memory"}}},
        "DISPATCH": "none",
        "BATCH_SIZE": 500,
    }
)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

#: Rows created over the *days* days before yesterday, oldest last (``g`` = rows).
CREATED = (
    "date_trunc('day', now()) - interval '1 day' "
    "- interval '1 day' * %(days)s * (g::float8 / (%(rows)s + 1))"
)
LAYOUTS = ("plain", "partitioned")


#: The fills finish a row a moment after it was created: here at once, so that a day's
#: rows all finished within the day (a row made just before midnight and finished just
#: after would keep its day's partition until the next purge, a moment later).
FINISHED_LATER = (
    " + interval '200 milliseconds'",
    " + interval '150 milliseconds'",
    " + interval '1 second'",
)


def statements() -> list[str]:
    """``admin_changelist``'s fills with every row done and our spread of times."""
    found = []
    for statement in (filled.OUTBOX, filled.INBOX, filled.JOBS):
        statement = statement.replace(filled.KIND, "'done'").replace(filled.CREATED, CREATED)
        for later in FINISHED_LATER:
            statement = statement.replace(later, "")
        found.append(statement)
    return found


def models() -> dict[str, type]:
    from django_outbox.models import InboxMessage, Job, OutboxMessage

    return {"outbox": OutboxMessage, "inbox": InboxMessage, "jobs": Job}


def prepare(layout: str, days: int) -> None:
    """A new database, migrated, its tables partitioned for the ``partitioned`` layout."""
    from django.core.management import call_command
    from django.db import connections

    from django_outbox.engine import insert, partitions
    from django_outbox.models import InboxSeen

    connections.close_all()
    common.recreate_database(BENCH_DB)
    partitions.forget()
    insert._CACHE.clear()
    call_command("migrate", verbosity=0)
    if layout == "partitioned":
        now = partitions._database_now("default")
        cutover = partitions.floor(now - timedelta(days=days + 2), "day")
        for model in models().values():
            partitions.convert(
                model,
                "default",
                "day",
                ahead=7,
                cutover=cutover,
                seen_model=InboxSeen if model._meta.db_table == "django_outbox_inbox" else None,
            )


#: A secondary index or unique constraint of a table, and how to make it again.
SECONDARY = """
SELECT i.relname, c.conname, coalesce(pg_get_constraintdef(c.oid), pg_get_indexdef(i.oid))
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
LEFT JOIN pg_constraint c ON c.conindid = x.indexrelid AND c.conrelid = x.indrelid
WHERE x.indrelid = %s::regclass AND (%s OR NOT x.indisprimary)
"""


def fill_table(table: str, statements: list[str], params: dict[str, int], primary: bool) -> None:
    """Run *statements* into *table* with its secondary indexes (and, with *primary*, its
    primary key) dropped, then build them again and ``VACUUM ANALYZE``.

    Filling tens of millions of rows through a random-keyed index is bound by that index's
    random writes once it outgrows memory (about 31,000 rows/s at 5 million, falling);
    building it once afterwards is a sort.
    """
    from django.db import connections

    connection = connections["default"]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET maintenance_work_mem = '1GB'")
            cursor.execute("SET max_parallel_maintenance_workers = 0")
            cursor.execute(SECONDARY, [table, primary])
            found = cursor.fetchall()
            for index, constraint, _ in found:
                if constraint:
                    cursor.execute(f'ALTER TABLE "{table}" DROP CONSTRAINT "{constraint}"')
                else:
                    cursor.execute(f'DROP INDEX "{index}"')
            for statement in statements:
                cursor.execute(statement, params)
            for _index, constraint, definition in found:
                if constraint:
                    cursor.execute(
                        f'ALTER TABLE "{table}" ADD CONSTRAINT "{constraint}" {definition}'
                    )
                else:
                    # A partitioned table's index reads "ON ONLY": made on the parent
                    # alone. Made on the parent, it is made on every partition.
                    cursor.execute(definition.replace(" ON ONLY ", " ON "))
            cursor.execute(f'VACUUM ANALYZE "{table}"')
    finally:
        connection.close()


def fill(rows: int, days: int, layout: str) -> float:
    """Each table filled on a connection of its own, the three at once."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    params = {"rows": rows, "days": days}
    outbox, inbox, jobs = statements()
    started = time.perf_counter()
    with ThreadPoolExecutor(3) as pool:
        done = [
            pool.submit(fill_table, "django_outbox_message", [outbox], params, False),
            pool.submit(fill_table, "django_outbox_inbox", [inbox], params, False),
            pool.submit(fill_table, "django_outbox_job", [jobs], params, False),
        ]
        for future in done:
            future.result()
    if layout == "partitioned":
        fill_table(
            "django_outbox_inbox_seen",
            [
                "INSERT INTO django_outbox_inbox_seen (source, message_id, received_at) "
                "SELECT source, message_id, received_at FROM django_outbox_inbox"
            ],
            params,
            True,
        )
    # The fill and the vacuum leave gigabytes of dirty pages that the checkpointer
    # would write out while the next figures are taken: written now, so that they
    # measure tables that hold the rows, not tables that were just filled.
    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")
    return time.perf_counter() - started


def relay_rate(items: int) -> float:
    from django.db import transaction

    import django_outbox
    from django_outbox.outbox.relay import Relay

    with transaction.atomic():
        for n in range(items):
            django_outbox.send("bench.item", {"n": n}, to="default")
    started = time.perf_counter()
    Relay(batch_size=500).drain(time_budget=3600)
    return items / (time.perf_counter() - started)


def inbox_rate(items: int) -> float:
    import uuid

    from django.db import transaction

    from django_outbox.inbox.api import prepare as prepared_row
    from django_outbox.inbox.api import receive_many
    from django_outbox.inbox.handling import Inbox

    batch = [
        prepared_row("bench.noop", {"n": n}, source="bench", message_id=str(uuid.uuid4()))
        for n in range(items)
    ]
    started = time.perf_counter()
    for start in range(0, items, 500):
        with transaction.atomic():
            receive_many(batch[start : start + 500])
    Inbox(batch_size=500).drain(time_budget=3600)
    return items / (time.perf_counter() - started)


def jobs_rate(items: int) -> float:
    from django.db import transaction

    from django_outbox.jobs.running import Jobs
    from testproject.shop import jobs

    with transaction.atomic():
        for _ in range(items):
            jobs.bench_noop.enqueue()
    started = time.perf_counter()
    Jobs(batch_size=500).drain(time_budget=3600)
    return items / (time.perf_counter() - started)


def list_ms(repeat: int) -> dict[str, float]:
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    user, _ = get_user_model().objects.get_or_create(
        username="bench", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    found = {}
    for part, model in models().items():
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        samples, _ = filled.time_page(client, url, repeat)
        found[part] = statistics.median(samples)
    return found


def measure(items: int, repeat: int) -> dict[str, float]:
    from django.db import connection

    figures = {
        "relay": statistics.median(relay_rate(items) for _ in range(repeat)),
        "inbox": statistics.median(inbox_rate(items) for _ in range(repeat)),
        "jobs": statistics.median(jobs_rate(items) for _ in range(repeat)),
    }
    figures |= {f"list {part}": ms for part, ms in list_ms(repeat).items()}
    # What the runs added, gone, so the next level starts from the fill alone.
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_outbox_message WHERE type = 'bench.item'")
        cursor.execute("DELETE FROM django_outbox_inbox WHERE source = 'bench'")
        cursor.execute("DELETE FROM django_outbox_inbox_seen WHERE source = 'bench'")
        cursor.execute("DELETE FROM django_outbox_job WHERE task_path LIKE '%%.bench_noop'")
    return figures


def purge_oldest_day(days: int) -> dict[str, tuple[float, int]]:
    """Seconds and rows of each part's purge with the cut-off at the end of the oldest
    filled day."""
    from django.db import connection

    from django_outbox.engine import partitions, sweeps
    from django_outbox.inbox.handling import Handling
    from django_outbox.jobs.running import Running
    from django_outbox.outbox.relay import Publishing

    now = partitions._database_now("default")
    oldest = partitions.floor(now - timedelta(days=days + 1), "day")
    end = oldest + timedelta(days=1)
    age = now - end
    found = {}
    for part in (Publishing(), Handling(), Running()):
        table = part.model._meta.db_table
        column = partitions.column_of(part.model, "created_at")
        with connection.cursor() as cursor:
            cursor.execute(
                f'SELECT count(*) FROM "{table}" WHERE "{column}" >= %s AND "{column}" < %s',
                [oldest, end],
            )
            before = cursor.fetchone()[0]
        started = time.perf_counter()
        sweeps.purge_finished(part, older_than=age, at=now)
        seconds = time.perf_counter() - started
        with connection.cursor() as cursor:
            cursor.execute(
                f'SELECT count(*) FROM "{table}" WHERE "{column}" >= %s AND "{column}" < %s',
                [oldest, end],
            )
            left = cursor.fetchone()[0]
        found[part.name] = (seconds, before - left)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="finished rows per table")
    parser.add_argument("--days", type=int, default=7, help="days the rows are spread over")
    parser.add_argument("--items", type=int, default=2000, help="rows per throughput run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--informational", action="store_true", help="(CI) print only")
    parser.add_argument("--no-purge", action="store_true", help="leave the purge out")
    options = parser.parse_args()

    import django

    django.setup()

    results: dict[str, dict[str, dict[str, float]]] = {}
    purges: dict[str, dict[str, tuple[float, int]]] = {}
    fills: dict[str, float] = {}
    for layout in options.layouts.split(","):
        prepare(layout, options.days)
        results[layout] = {"0": measure(options.items, options.repeat)}
        fills[layout] = fill(options.rows, options.days, layout)
        print(
            f"{layout}: filled {options.rows:,} rows a table in {fills[layout]:.0f} s", flush=True
        )
        results[layout][str(options.rows)] = measure(options.items, options.repeat)
        if not options.no_purge:
            purges[layout] = purge_oldest_day(options.days)
    common.drop_database(BENCH_DB)

    print(
        f"\n## Partitioned tables: {options.rows:,} finished rows a table over "
        f"{options.days} days ({date.today()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()})\n"
    )
    print("| Figure | Layout | At 0 rows | At " + f"{options.rows:,}" + " | Ratio |")
    print("|---|---|---|---|---|")
    for figure in results[next(iter(results))]["0"]:
        unit = "ms" if figure.startswith("list") else "/s"
        for layout, levels in results.items():
            empty, full = levels["0"][figure], levels[str(options.rows)][figure]
            # A slowdown as a ratio above 1, for rates and times alike.
            ratio = full / empty if unit == "ms" else empty / full
            print(f"| {figure} ({unit}) | {layout} | {empty:,.0f} | {full:,.0f} | {ratio:.2f}x |")
    print("\n| Purge of the oldest day | Layout | Seconds | Rows removed |")
    print("|---|---|---|---|")
    for layout, parts in purges.items():
        for part, (seconds, count) in parts.items():
            print(f"| {part} | {layout} | {seconds:,.2f} | {count:,} |")


if __name__ == "__main__":
    main()
