"""django-celery-outbox's relay, measured on the same machine and database.

    python -m tests.benchmarks.peer --messages 10000

Fills its outbox through its own API (``OutboxCelery.send_task`` inside one
transaction), starts its ``celery_outbox_relay`` command, and times from the
first row it publishes to the last (its relay deletes published rows).
Needs ``pip install django-celery-outbox==0.4.3`` (``make bench`` does it).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def peer_env(database_url: str, broker_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.peer_settings",
        "DATABASE_URL": database_url,
        "PEER_BROKER_URL": broker_url,
    }


def fill(count: int) -> None:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from testproject.peer_celery import app

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE celery_outbox")
    with transaction.atomic():
        for n in range(count):
            app.send_task(
                "bench.noop",
                args=[{"order_id": n, "customer": f"customer-{n % 100}", "total_cents": 1000 + n}],
            )


def measure(count: int, database_url: str, broker_url: str) -> float:
    """Messages per second of one ``celery_outbox_relay`` process, batches of 500."""
    import psycopg
    import redis

    env = peer_env(database_url, broker_url)
    subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.peer", "--fill", str(count)],
        cwd=ROOT,
        env=env,
        check=True,
    )
    redis.Redis.from_url(broker_url).flushdb()
    relay = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "celery_outbox_relay",
            "--batch-size",
            "500",
            "--idle-time",
            "0.05",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:

            def remaining() -> int:
                row = conn.execute("SELECT count(*) FROM celery_outbox").fetchone()
                return int(row[0]) if row else 0

            deadline = time.monotonic() + 600
            while remaining() == count:
                if time.monotonic() > deadline or relay.poll() is not None:
                    raise RuntimeError("the peer relay never started publishing")
                time.sleep(0.005)
            started = time.perf_counter()
            first_left = remaining()
            while (left := remaining()) > 0:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the peer relay stalled with {left} rows left")
                time.sleep(0.02)
            elapsed = time.perf_counter() - started
    finally:
        relay.send_signal(signal.SIGTERM)
        try:
            relay.wait(timeout=30)
        except subprocess.TimeoutExpired:
            relay.kill()
    redis.Redis.from_url(broker_url).flushdb()
    # Rows published before the clock started are not counted.
    return first_left / elapsed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fill", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--messages", type=int, default=10000)
    args = parser.parse_args()
    if args.fill is not None:
        fill(args.fill)
        return 0
    database_url = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/django_outbox_bench"
    )
    rate = measure(args.messages, database_url, "redis://127.0.0.1:6379/10")
    print(f"django-celery-outbox relay: {rate:,.0f} msgs/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
