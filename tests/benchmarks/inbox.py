"""Inbox throughput: RabbitMQ → PostgreSQL, side by side with its limits.

    python -m tests.benchmarks.inbox --messages 60000 --processes 2 --repeat 3

Four consumers drain the same number of pre-published messages from a
RabbitMQ queue, each with ``--processes`` processes, one after the other:

- ``kombu ack`` (the limit): a plain kombu consumer that acknowledges each
  message and does nothing else (no database);
- ``lean batch insert + multi-ack`` (the bound for a deduplicating consumer,
  ``tests.benchmarks.lean_inbox``): kombu and psycopg, one ``INSERT … ON CONFLICT DO
  NOTHING`` per batch of up to 500, marked handled in the same transaction, one
  multiple ack after the commit;
- ``celery acks_late``: a Celery worker (prefork, ``--processes`` children)
  running a no-op task with ``acks_late`` per message, the usual hand-rolled
  consumer (no deduplication);
- ``inbox_consume``: django-outbox's consumer storing every message in the
  inbox (PostgreSQL), acknowledging after the commit and handling it with a
  no-op handler in lock mode (savepoint per message).

The figure is messages per second from the first process start until the
last message is done (acknowledged, or handled for the inbox), process start
included. Prints a Markdown table of medians and ratios; the target (inbox ≥
5,000/s with 2 processes) is reported as met or missed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import uuid
from datetime import date
from pathlib import Path

from tests.benchmarks import common

BENCH_DB = os.environ.get(
    "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/django_outbox_inbox_bench"
)
AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/10")
QUEUE = "inbox-bench"
ROOT = Path(__file__).resolve().parents[2]

os.environ["DATABASE_URL"] = BENCH_DB
os.environ["OUTBOX_DISPATCH"] = "none"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

SETTINGS = {
    "DISPATCH": "none",
    "INBOX": {"SOURCES": {"bench": {"TRANSPORT": "kombu", "URL": AMQP_URL, "QUEUE": QUEUE}}},
}

PLAIN_CONSUMER = """
import sys, kombu
url, queue, idle = sys.argv[1], sys.argv[2], float(sys.argv[3])
with kombu.Connection(url) as conn:
    def on_message(message):
        message.ack()
    with conn.Consumer([kombu.Queue(queue, durable=True)], on_message=on_message,
                       prefetch_count=1000):
        while True:
            try:
                conn.drain_events(timeout=idle)
            except TimeoutError:
                break
"""


def ensure_database() -> None:
    common.ensure_database(BENCH_DB)


def setup_django() -> None:
    ensure_database()
    os.environ["OUTBOX_SETTINGS_JSON"] = json.dumps(SETTINGS)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def publish(count: int, body_for: str = "inbox") -> None:
    """Put *count* messages on the queue as our outbox would (or Celery task messages)."""
    import kombu

    with kombu.Connection(AMQP_URL) as conn:
        channel = conn.channel()
        queue = kombu.Queue(QUEUE, durable=True)
        queue(channel).declare()
        queue(channel).purge()
        producer = kombu.Producer(channel)
        if body_for == "celery":
            from testproject.celery import app

            with app.connection_for_write(AMQP_URL) as celery_conn:
                celery_producer = app.amqp.Producer(celery_conn)
                for _ in range(count):
                    app.send_task(
                        "shop.bench_noop", producer=celery_producer, queue=QUEUE, retry=False
                    )
            return
        for n in range(count):
            producer.publish(
                b'{"n": %d}' % n,
                routing_key=QUEUE,
                content_type="application/json",
                content_encoding="utf-8",
                headers={
                    "outbox-message-id": str(uuid.uuid4()),
                    "outbox-type": "bench.noop",
                },
            )


def queue_depth() -> int:
    import kombu

    with kombu.Connection(AMQP_URL) as conn:
        _, ready, _ = conn.default_channel.queue_declare(QUEUE, passive=True)
        return int(ready)


def run_processes(commands: list[list[str]], env: dict[str, str], done) -> float:
    started = time.perf_counter()
    processes = [
        subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for c in commands
    ]
    try:
        while not done():
            if all(p.poll() is not None for p in processes):
                errors = b"".join(p.stderr.read() for p in processes if p.stderr)
                raise RuntimeError(f"consumers exited early: {errors.decode()[-2000:]}")
            time.sleep(0.02)
        return time.perf_counter() - started
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)


def bench_plain(count: int, processes: int) -> float:
    """Until every plain consumer exits after ``IDLE`` seconds without a message (the
    idle wait is subtracted)."""
    publish(count)
    command = [sys.executable, "-c", PLAIN_CONSUMER, AMQP_URL, QUEUE, str(IDLE)]
    started = time.perf_counter()
    children = [subprocess.Popen(command, cwd=ROOT) for _ in range(processes)]
    for child in children:
        child.wait(timeout=600)
    elapsed = time.perf_counter() - started - IDLE
    if queue_depth():
        raise RuntimeError("the plain consumers left messages behind")
    return count / elapsed


#: Seconds a plain consumer waits for another message before it exits.
IDLE = 0.5


def bench_celery(count: int, processes: int) -> float:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    client.delete("bench-noop")
    publish(count, body_for="celery")
    env = dict(os.environ, CELERY_BROKER_URL=AMQP_URL, TESTPROJECT_BENCH_REDIS=REDIS_URL)
    command = [
        *(sys.executable, "-m", "celery", "-A", "testproject", "worker"),
        *("-Q", QUEUE, "--concurrency", str(processes), "--prefetch-multiplier", "100"),
        *("--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "ERROR"),
    ]
    elapsed = run_processes([command], env, lambda: int(client.get("bench-noop") or 0) >= count)
    return count / elapsed


#: CPU seconds per message of each drain measured from its first row on (start-up
#: left out), per consumer: ours and the lean one.
DRAIN_CPU: dict[str, list[float]] = {}
#: The database server's CPU seconds per message over the same drains.
SERVER_CPU: dict[str, list[float]] = {}


def drain(name: str, commands: list[list[str]], env: dict[str, str], count: int) -> float:
    """Start *commands* (consumers of the queue, already filled), and measure them from
    their first stored row to the last one handled: messages per second from the rows'
    own times (the first ``received_at`` to the last ``handled_at``), and their CPU
    over the same drain from ``/proc`` (into ``DRAIN_CPU[name]``). Both left out the
    processes' start-up, which for a Django process is a second of a two-second run."""
    from django.db.models import Max, Min

    from django_outbox.models import InboxMessage, InboxState

    children = [
        subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for c in commands
    ]
    pids = [child.pid for child in children]
    rows = InboxMessage.objects.all()
    handled = rows.filter(state=InboxState.HANDLED)
    try:
        deadline = time.monotonic() + 600
        while not rows.exists():
            if time.monotonic() > deadline or all(c.poll() is not None for c in children):
                errors = b"".join(c.stderr.read() for c in children if c.stderr)
                raise RuntimeError(f"{name} stored nothing: {errors.decode()[-2000:]}")
            time.sleep(0.005)
        cpu, server = common.process_cpu(pids), common.server_cpu()
        while handled.count() < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} handled {handled.count()} of {count}")
            # The rate comes from the rows' own times, not from this loop: counting the
            # table often would only take the consumers' CPU (two cores, shared).
            time.sleep(0.25)
        DRAIN_CPU.setdefault(name, []).append((common.process_cpu(pids) - cpu) / count)
        SERVER_CPU.setdefault(name, []).append((common.server_cpu() - server) / count)
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait(timeout=30)
    if queue_depth():
        raise RuntimeError(f"{name} left messages in the queue")
    span = rows.aggregate(first=Min("created_at"), last=Max("finished_at"))  # received, handled
    return count / max((span["last"] - span["first"]).total_seconds(), 1e-6)


def bench_inbox(count: int, processes: int) -> float:
    from django.db import connection

    from django_outbox.models import InboxCursor, InboxMessage

    with connection.cursor() as cursor:  # each run starts from an empty, unbloated table
        cursor.execute(f"TRUNCATE {InboxMessage._meta.db_table}, {InboxCursor._meta.db_table}")
    publish(count)
    env = dict(os.environ, OUTBOX_SETTINGS_JSON=json.dumps(SETTINGS))
    command = [sys.executable, "manage.py", "inbox_consume", "bench", "--batch", "500"]
    return drain("inbox_consume", [command] * processes, env, count)


def bench_lean(count: int, processes: int) -> float:
    """The lean bound (``tests.benchmarks.lean_inbox``), measured as ours is."""
    from django.db import connection

    from django_outbox.models import InboxMessage

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {InboxMessage._meta.db_table}")
    publish(count)
    command = [sys.executable, "-m", "tests.benchmarks.lean_inbox", AMQP_URL, QUEUE, BENCH_DB]
    command.append("3600")  # runs until stopped, as inbox_consume does
    return drain("lean batch insert + multi-ack", [command] * processes, dict(os.environ), count)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measured(run, count: int, processes: int, cpu: list[float]) -> float:
    """*run*'s rate, and its processes' CPU per message (start-up included) into *cpu*."""
    before = children_cpu()
    rate = run(count, processes)
    cpu.append((children_cpu() - before) / count)
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=60_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--informational", action="store_true", help="A reduced CI run.")
    args = parser.parse_args()
    setup_django()
    runs = {
        "kombu ack": bench_plain,
        "lean batch insert + multi-ack": bench_lean,
        "celery acks_late": bench_celery,
        "inbox_consume": bench_inbox,
    }
    results: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeat):
        for name, run in runs.items():
            results[name].append(measured(run, args.messages, args.processes, cpu[name]))
    medians = {name: statistics.median(values) for name, values in results.items()}
    cpu_medians = {name: statistics.median(values) for name, values in cpu.items()}
    limit = medians["kombu ack"]
    lean = medians["lean batch insert + multi-ack"]
    print(
        f"\n{date.today()} · {os.cpu_count()} cores · Python {platform.python_version()} · "
        f"{args.messages} messages, {args.processes} processes, median of {args.repeat}\n"
    )
    print(
        "| consumer | messages/s | of kombu ack | of the lean consumer "
        "| CPU per message (its processes, start-up included) "
        "| CPU per message over the drain |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    drain_cpu = {name: statistics.median(values) for name, values in DRAIN_CPU.items()}
    for name, value in medians.items():
        over_drain = f"{drain_cpu[name] * 1e3:.3f} ms" if name in drain_cpu else "—"
        print(
            f"| {name} | {value:,.0f} | {value / limit:.2f} | {value / lean:.2f} "
            f"| {cpu_medians[name] * 1e3:.3f} ms | {over_drain} |"
        )
    print(
        "\nThe lean consumer and inbox_consume are timed from their first stored row to "
        "their last handled one (start-up left out); kombu ack and Celery from their "
        "start (an idle wait subtracted), as they store no rows."
    )
    ours_cpu, lean_cpu = drain_cpu["inbox_consume"], drain_cpu["lean batch insert + multi-ack"]
    print(
        f"CPU per message over the drain: inbox_consume {ours_cpu * 1e3:.3f} ms, the lean "
        f"consumer {lean_cpu * 1e3:.3f} ms ({ours_cpu / lean_cpu:.2f}x)"
    )
    server = {name: statistics.median(values) for name, values in SERVER_CPU.items()}
    ours_db, lean_db = server["inbox_consume"], server["lean batch insert + multi-ack"]
    print(
        f"PostgreSQL's CPU per message over the same drains (the server's processes, the "
        f"polling of the harness included): inbox_consume {ours_db * 1e3:.3f} ms, the lean "
        f"consumer {lean_db * 1e3:.3f} ms; consumer and server together "
        f"{(ours_cpu + ours_db) * 1e3:.3f} against {(lean_cpu + lean_db) * 1e3:.3f} ms "
        f"({(ours_cpu + ours_db) / (lean_cpu + lean_db):.2f}x)"
    )
    inbox = medians["inbox_consume"]
    note = " (reduced run, informational)" if args.informational else ""
    for target, met in {
        f"inbox_consume ≥ 5,000 messages/s with {args.processes} processes": inbox >= 5000,
        "inbox_consume ≥ 0.85 of the lean consumer": inbox >= 0.85 * lean,
    }.items():
        print(f"target {target}: {'met' if met else 'MISSED'}{note}")


if __name__ == "__main__":
    main()
