"""Commit → handled latency across two services: A's outbox → RabbitMQ → B's inbox.

    python -m tests.benchmarks.inbox_latency --rate 500 --seconds 10

Service A (database ``django_outbox_bench``) commits transactions, each with one
``send()``, from 4 producer processes paced to the offered rate, and notes the
wall-clock time right after each commit; its ``outbox_relay`` wakes on NOTIFY
and publishes to RabbitMQ with publisher confirms. Service B (database
``django_outbox_inbox_bench``) runs ``inbox_consume``, whose handler notes the
time it runs. Latency is handler time minus commit time for every message (same
host, same clock). Prints p50, p95, p99 and max in milliseconds; nothing is
asserted.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable
from datetime import date
from typing import Any

import psycopg

from tests.benchmarks import inbox as b_side
from tests.benchmarks import latency
from tests.benchmarks import relay as harness

QUEUE = "inbox-latency"
A_SETTINGS = {
    "OUTBOX": {
        "DESTINATIONS": {"b": {"TRANSPORT": "kombu", "URL": harness.AMQP_URL, "QUEUE": QUEUE}}
    },
    "DISPATCH": "notify",
}
B_SETTINGS = {
    "DISPATCH": "none",
    "INBOX": {"SOURCES": {"a": {"TRANSPORT": "kombu", "URL": harness.AMQP_URL, "QUEUE": QUEUE}}},
}


def produce(
    rate: float,
    seconds: float,
    settings: dict | None,
    start: Any,
    out: multiprocessing.Queue,
) -> None:
    """One producer process of service A (its settings *settings*, default the RabbitMQ
    path's): ``latency.paced_sends`` of one ``send()`` a transaction."""
    os.environ.update(latency.child_env(settings or A_SETTINGS))
    import django

    django.setup()
    from django.db import transaction

    import django_outbox

    def send(n: int) -> str:
        with transaction.atomic():
            return str(django_outbox.send("bench.latency", {"n": n}, to="b").message_id)

    out.put(latency.paced_sends(send, rate, seconds, start))


def service_env(database: str, settings: dict) -> dict[str, str]:
    env = latency.child_env(settings)
    env["DATABASE_URL"] = database
    return env


def run_producers(rate: float, seconds: float, settings: dict) -> dict[str, float]:
    """Service A's ``PRODUCERS`` producer processes at *rate* in all for *seconds* (after
    ``latency.WARMUP_SECONDS``), with *settings*: the commit time of each measured
    message, by message id."""
    return latency.run_paced(produce, (rate / latency.PRODUCERS, seconds, settings), seconds)


def wait_handled(database: str, committed: Iterable[str], timeout: float = 60) -> dict[str, float]:
    """When the handler ran for each message of *committed* (message ids), read from
    service B's *database* until all of them are there or *timeout* seconds have passed."""
    wanted = set(committed)
    handled: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while not wanted <= handled.keys() and time.monotonic() < deadline:
        time.sleep(0.5)
        with psycopg.connect(database) as b:
            rows = b.execute(
                "SELECT order_ref, sequence FROM shop_payment WHERE status = 'latency'"
            ).fetchall()
        handled = {ref: micros / 1_000_000 for ref, micros in rows}
    return handled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args()
    harness.setup_django()  # service A's database, migrated
    b_side.ensure_database()
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"],
        cwd=latency.ROOT,
        env=service_env(b_side.BENCH_DB, B_SETTINGS),
        check=True,
    )
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_outbox_message, django_outbox_key, django_outbox_worker")
    with psycopg.connect(b_side.BENCH_DB, autocommit=True) as b:
        b.execute("TRUNCATE django_outbox_inbox, django_outbox_inbox_cursor, shop_payment")
    import kombu

    with kombu.Connection(harness.AMQP_URL) as conn:
        queue = kombu.Queue(QUEUE, durable=True)
        queue(conn.default_channel).declare()
        queue(conn.default_channel).purge()
    relay = subprocess.Popen(
        [sys.executable, "manage.py", "outbox_relay", "--interval", "5"],
        cwd=latency.ROOT,
        env=service_env(harness.BENCH_DB, A_SETTINGS),
        stdout=subprocess.DEVNULL,
    )
    consumer = subprocess.Popen(
        [sys.executable, "manage.py", "inbox_consume", "a"],
        cwd=latency.ROOT,
        env=service_env(b_side.BENCH_DB, B_SETTINGS),
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(3)  # both are up
        committed = run_producers(args.rate, args.seconds, A_SETTINGS)
        handled = wait_handled(b_side.BENCH_DB, committed)
    finally:
        for process in (relay, consumer):
            process.terminate()
            process.wait(30)
    values = sorted((handled[m] - t) * 1000 for m, t in committed.items() if m in handled)
    print(
        f"\n{date.today()} · {os.cpu_count()} cores · Python {platform.python_version()} · "
        f"{args.rate:g}/s offered for {args.seconds:g} s, {len(committed)} committed, "
        f"{len(committed) - len(values)} not handled in time\n"
    )
    print("| path | p50 ms | p95 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    print(
        "| A commit → notify → relay → RabbitMQ (confirmed) → B inbox_consume → handler | "
        + " | ".join(f"{latency.percentile(values, q):.1f}" for q in (0.50, 0.95, 0.99))
        + f" | {values[-1]:.1f} |"
    )
    print(json.dumps({"committed": len(committed), "handled": len(values)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
