"""What counting costs: ``send()``, the relay, the inbox and the jobs with the
engine's telemetry off, with the per-minute tally only, and with Prometheus metrics.

    python -m tests.benchmarks.telemetry --items 5000 --rounds 5

In one process on PostgreSQL (a database of its own), in rounds that take turns
between the three modes (so a slower minute of the machine hits every mode):

- ``off``: the engine's ``telemetry.recorded``/``rescued`` replaced by no-ops
  and metrics off: the code before issue 15;
- ``chart``: the per-minute tally the health page draws (``METRICS`` False);
- ``metrics``: the tally and the Prometheus counters and histograms (the
  default when prometheus-client is installed).

Per mode and path: items per second of wall-clock time (median over the rounds)
and CPU microseconds per item of this process (the database's CPU is not in it),
median and best; the cost is the best CPU time against the best of ``off`` (the
least disturbed run of each: on a 2-core machine shared with PostgreSQL the
medians move by several per cent between identical runs). Paths: ``send()`` (one message per
transaction), ``Relay().drain()`` over a memory destination, ``Inbox().drain()``
with the test project's no-op handler (``bench.noop``), ``Jobs().drain()`` of
no-op jobs. The target (issue 15) is at most 2 % of throughput; reported, never
asserted.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import time
import uuid
from datetime import date

from tests.benchmarks import common

BENCH_DB = os.environ.get(
    "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/django_outbox_telemetry_bench"
)
SETTINGS = {
    "DISPATCH": "none",
    "OUTBOX": {"DESTINATIONS": {"default": {"TRANSPORT": "memory"}}},
    "INBOX": {"SOURCES": {"bench": {"TRANSPORT": "webhook", "SECRET": "bench-secret"}}},
    "BATCH_SIZE": 500,
}
os.environ["DATABASE_URL"] = BENCH_DB
os.environ["DEBUG"] = "0"  # production-like: no per-query bookkeeping
os.environ["OUTBOX_SETTINGS_JSON"] = json.dumps(SETTINGS)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
MODES = ("off", "chart", "metrics")


def setup_django() -> None:
    common.ensure_database(BENCH_DB)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


class Mode:
    """Switches the engine's counting for one measurement."""

    def __init__(self) -> None:
        from django_outbox.engine import telemetry

        self.recorded = telemetry.recorded
        self.rescued = telemetry.rescued

    def set(self, mode: str) -> None:
        from django_outbox import metrics
        from django_outbox.engine import telemetry

        if mode == "off":
            telemetry.recorded = lambda part, changes: None  # type: ignore[assignment]
            telemetry.rescued = lambda part, number: None  # type: ignore[assignment]
        else:
            telemetry.recorded = self.recorded  # type: ignore[assignment]
            telemetry.rescued = self.rescued  # type: ignore[assignment]
        metrics._enabled = mode == "metrics"
        telemetry.discard()


def truncate() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE django_outbox_message, django_outbox_key, django_outbox_inbox, "
            "django_outbox_inbox_cursor, django_outbox_job, django_outbox_minute_count"
        )


def timed(work) -> tuple[float, float]:
    gc.collect()  # no collection of the previous run's garbage inside this one
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def bench_send(items: int) -> tuple[float, float]:
    from django.db import transaction

    import django_outbox

    def work() -> None:
        for n in range(items):
            with transaction.atomic():
                django_outbox.send("bench.sent", {"n": n})

    return timed(work)


def bench_relay(items: int) -> tuple[float, float]:
    from django_outbox.models import OutboxMessage
    from django_outbox.outbox.relay import Relay
    from django_outbox.outbox.transports import memory

    OutboxMessage.objects.bulk_create(
        OutboxMessage(message_id=uuid.uuid4(), type="bench.sent", destination="default", payload={})
        for _ in range(items)
    )
    memory.clear()
    result = timed(lambda: Relay().drain())
    assert not OutboxMessage.objects.filter(state="should_be_sent").exists()
    return result


def bench_inbox(items: int) -> tuple[float, float]:
    from django_outbox.inbox.handling import Inbox
    from django_outbox.models import InboxMessage

    InboxMessage.objects.bulk_create(
        InboxMessage(source="bench", message_id=str(uuid.uuid4()), type="bench.noop", payload={})
        for _ in range(items)
    )
    result = timed(lambda: Inbox().drain())
    assert not InboxMessage.objects.filter(state="should_be_handled").exists()
    return result


def bench_jobs(items: int) -> tuple[float, float]:
    from django_outbox.jobs.models import Job
    from django_outbox.jobs.running import Jobs

    Job.objects.bulk_create(
        Job(
            result_id=uuid.uuid4(),
            task_path="testproject.shop.jobs.bench_noop",
            args=[],
            kwargs={},
            max_attempts=1,
        )
        for _ in range(items)
    )
    result = timed(lambda: Jobs().drain())
    assert not Job.objects.filter(state="READY").exists()
    return result


PATHS = {"send()": bench_send, "relay": bench_relay, "inbox": bench_inbox, "jobs": bench_jobs}


def hook_costs(repeat: int = 200, group: int = 500) -> dict[tuple[str, str], float]:
    """What the counting hooks of each path cost per item, in µs, timed alone: the
    end-to-end runs above cannot resolve a 1 % difference on this machine, this can.
    Per path, the hooks that path calls: the engine's ``recorded()`` for a group of
    *group* done rows (every part; the inbox's and the jobs' rows carrying their step's
    duration), and per item ``send()``'s on-commit count, the step's clock reads and
    the jobs' start count (metrics only)."""
    from django.db import transaction
    from django.utils import timezone

    from django_outbox import metrics
    from django_outbox.engine import telemetry
    from django_outbox.engine.transitions import Change, Transition
    from django_outbox.inbox.handling import Handling
    from django_outbox.jobs.models import Job
    from django_outbox.jobs.running import Running
    from django_outbox.models import InboxMessage, OutboxMessage
    from django_outbox.outbox.relay import Publishing

    now = timezone.now()
    rows = {
        "relay": (
            Publishing(),
            [OutboxMessage(pk=n, destination="default", created_at=now) for n in range(group)],
        ),
        "inbox": (Handling(), [InboxMessage(pk=n, source="bench") for n in range(group)]),
        "jobs": (Running(), [Job(pk=n, queue_name="default") for n in range(group)]),
    }
    for path in ("inbox", "jobs"):  # what their steps leave on each row they ran
        for row in rows[path][1]:
            setattr(row, metrics.STEP_SECONDS, 0.0004)
    flush_soon = telemetry._flush_soon
    telemetry._flush_soon = lambda using: None  # type: ignore[assignment]
    costs: dict[tuple[str, str], float] = {}
    try:
        for mode in ("chart", "metrics"):
            metrics._enabled = mode == "metrics"
            costs["send()", mode] = 0.0
            if mode == "metrics":
                started = time.perf_counter()
                with transaction.atomic():
                    for _ in range(repeat * 10):
                        metrics.counted_on_commit("outbox", "enqueued", "default", "default")
                costs["send()", mode] = (time.perf_counter() - started) / (repeat * 10) * 1e6
            for path, (part, group_rows) in rows.items():
                changes = [Change(row, Transition.MARK_DONE, {}) for row in group_rows]
                started = time.perf_counter()
                for _ in range(repeat):
                    telemetry.recorded(part, changes)
                per_item = (time.perf_counter() - started) / (repeat * group) * 1e6
                if mode == "metrics" and path != "relay":
                    # Per item: the step's two clock reads, and a job's start count.
                    started = time.perf_counter()
                    for _ in range(repeat * 10):
                        began = time.perf_counter()
                        setattr(group_rows[0], metrics.STEP_SECONDS, time.perf_counter() - began)
                        if path == "jobs":
                            metrics.counted("jobs", "started", "default")
                    per_item += (time.perf_counter() - started) / (repeat * 10) * 1e6
                costs[path, mode] = per_item
    finally:
        telemetry._flush_soon = flush_soon  # type: ignore[assignment]
        telemetry.discard()
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--informational", action="store_true", help="(CI) a smoke run")
    args = parser.parse_args()
    setup_django()
    mode = Mode()
    figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for round_ in range(args.rounds + 1):  # the first round warms up, not counted
        order = MODES if round_ % 2 else tuple(reversed(MODES))
        for path, bench in PATHS.items():
            for name in order:
                truncate()
                mode.set(name)
                wall, cpu = bench(args.items)
                if round_:
                    figures.setdefault((path, name), []).append((wall, cpu))
    mode.set("metrics")
    print(
        f"\n### Telemetry overhead ({args.items} items, {args.rounds} rounds; "
        f"{date.today()}, {platform.python_version()}, {os.cpu_count()} CPUs)\n"
    )
    print(
        "| path | mode | items/s (median) | CPU µs/item (median) | CPU µs/item (best) "
        "| CPU vs off (best) |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for path in PATHS:
        base = min(c for _, c in figures[path, "off"])
        for name in MODES:
            runs = figures[path, name]
            rate = statistics.median(args.items / w for w, _ in runs)
            cpu = statistics.median(c / args.items * 1e6 for _, c in runs)
            best = min(c for _, c in runs)
            print(
                f"| {path} | {name} | {rate:,.0f} | {cpu:.1f} | {best / args.items * 1e6:.1f} "
                f"| {best / base:.3f} |"
            )
    costs = hook_costs()
    print("\nThe hooks alone, per item, against the path's CPU per item with counting off:\n")
    print("| path | mode | hooks µs/item | path CPU µs/item (off, best) | cost |")
    print("|---|---|---:|---:|---:|")
    for path in PATHS:
        base = min(c for _, c in figures[path, "off"]) / args.items * 1e6
        for name in ("chart", "metrics"):
            added = costs[path, name]
            print(f"| {path} | {name} | {added:.2f} | {base:.1f} | {added / base:.1%} |")


if __name__ == "__main__":
    main()
