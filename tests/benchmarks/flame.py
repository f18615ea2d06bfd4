"""Flame graphs of the hot paths, recorded with py-spy (``make flame``).

    python -m tests.benchmarks.flame relay --messages 100000 --out docs/img/flame-relay.svg
    python -m tests.benchmarks.flame jobs --jobs 20000 --out docs/img/flame-jobs.svg

``relay``: the relay benchmark's backlog (unkeyed, to Redis) drained by one
``Relay`` in a process of its own, recorded from its first claim to the last record.
``jobs``: one ``jobs_worker`` draining the jobs benchmark's no-op jobs (as
``enqueue()`` makes them), recorded over its whole life (start-up shows at the left).
Samples are taken only from the thread holding the GIL (``--gil``): the graph is
where the Python CPU goes, not where threads wait.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RATE = "250"  # samples per second


def spy(out: str, command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    py_spy = Path(sys.executable).with_name("py-spy")
    record = [str(py_spy), "record", "--gil", "-r", RATE, "--format", "flamegraph", "-o", out]
    return subprocess.Popen([*record, "--", *command], cwd=ROOT, env=env)


def relay(messages: int, out: str) -> None:
    from tests.benchmarks import relay as harness

    harness.setup_django()
    harness.configure()
    harness.clear_redis()
    harness.fill(messages, "bench-redis")
    child = [sys.executable, "-m", "tests.benchmarks.flame", "_drain", str(messages)]
    if spy(out, child).wait():
        raise SystemExit("py-spy failed")


def drain(messages: int) -> None:
    """The recorded process of ``relay``: drain the backlog, as the benchmark does."""
    from tests.benchmarks import relay as harness

    harness.setup_django()
    harness.configure()
    from django_outbox.engine.loop import settle_heap  # a model import: after setup

    settle_heap()
    rate = harness.run_outbox_relay(messages, "bench-redis")
    print(f"drained {messages} messages at {rate:,.0f}/s (under py-spy)")


def jobs(count: int, out: str) -> None:
    from django.db import connection

    from tests.benchmarks import jobs as harness

    harness.setup_django()
    from django_outbox.engine.models import Worker
    from django_outbox.jobs.models import Job, JobState

    harness.truncate()
    Worker.objects.all().delete()
    harness.fill(count, held_back=harness.HELD_BACK_SECONDS)
    recorder = spy(out, harness.WORKER_COMMAND, harness.child_env())
    deadline = time.monotonic() + 120
    while not Worker.objects.exists():
        if time.monotonic() > deadline:
            raise SystemExit("jobs_worker did not start")
        time.sleep(0.05)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE django_outbox_job SET available_at = now()")
    done = Job.objects.filter(state=JobState.SUCCESSFUL)
    while done.count() < count:
        time.sleep(0.1)
    # Stop the worker (py-spy's child), not py-spy: it writes the graph when it ends.
    for pid in subprocess.run(
        ["pgrep", "-P", str(recorder.pid)], capture_output=True, text=True
    ).stdout.split():
        os.kill(int(pid), 15)
    if recorder.wait(60):
        raise SystemExit("py-spy failed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", choices=["relay", "jobs", "_drain"])
    parser.add_argument("count", nargs="?", type=int)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.path == "_drain":
        drain(args.count)
    elif args.path == "relay":
        relay(args.messages, args.out or "docs/img/flame-relay.svg")
    else:
        jobs(args.jobs, args.out or "docs/img/flame-jobs.svg")


if __name__ == "__main__":
    main()
