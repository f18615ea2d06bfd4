"""Where a ``jobs_worker``'s CPU goes, phase by phase (``make bench-jobs-phases``).

    python -m tests.benchmarks.jobs_phases --jobs 20000

Runs the jobs benchmark's drain (``tests.benchmarks.jobs.bench_ours``, one process) with
the worker started through this module: before ``jobs_worker`` runs, the engine's and
the jobs part's main functions are wrapped to add up the CPU time of the thread that
calls them (``time.thread_time``), inclusive of what they call. The table is per job
run; the claims run on the worker's helper thread, everything else on its main thread.

Why not a sampling profile: py-spy's ``--gil`` samples the thread that last held the
GIL, so a thread waiting for PostgreSQL with no other thread running is counted as
busy; its default mode counts threads in a socket wait as running as well. Both showed
the record's ``SELECT`` and ``UPDATE`` as large, where the CPU they cost is small. A
thread's CPU clock counts only what it ran. Each wrapped call adds about 2 µs (two
clock reads): the per-job rows (``run_one``, ``begin``, ``idle``) carry that much each.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import functools
import importlib
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

#: (module, class or None, function): the phases measured.
PHASES = [
    ("django_outbox.engine.runner", "Runner", "_run"),
    ("django_outbox.engine.runner", "Runner", "claim_batch"),
    ("django_outbox.engine.lease", "ClaimStatement", "run"),
    ("django_outbox.jobs.running", "Running", "run_one"),
    ("django_outbox.engine.runner", "Runner", "record"),
    ("django_outbox.engine.runner", "Runner", "_report"),
    ("django_outbox.jobs.running", "Running", "on_done"),
    ("django_outbox.engine.transitions", None, "apply"),
    ("django_outbox.engine.lease", "FencedRows", "update"),
    ("django_outbox.jobs.running", "Running", "record_time"),
    ("django_outbox.jobs.running", "Running", "_declare_window"),
    ("django_outbox.engine.runner", "LeaseAttempt", "begin"),
    ("django_outbox.engine.runner", "LeaseAttempt", "idle"),
    ("django_outbox.engine.telemetry", None, "recorded"),
]
REPORT = Path(os.environ.get("JOBS_PHASES_REPORT", "/tmp/django-outbox-jobs-phases.json"))


def wrap_phases(
    phases: list[tuple[str, str | None, str]] = PHASES,
) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Wrap each of *phases* to add up its thread's CPU time and its calls."""
    spent: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    clock = time.thread_time

    def timed(name: str, function: Any) -> Any:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            began = clock()
            try:
                return function(*args, **kwargs)
            finally:
                spent[name] += clock() - began
                calls[name] += 1

        return wrapper

    for module_name, owner_name, function_name in phases:
        module = importlib.import_module(module_name)
        owner = getattr(module, owner_name) if owner_name else module
        name = f"{owner_name}.{function_name}" if owner_name else function_name
        setattr(owner, function_name, timed(name, getattr(owner, function_name)))
    return spent, calls


def worker() -> None:
    """The worker process: wrap, run ``jobs_worker``, write the sums when it stops."""
    import django

    django.setup()
    spent, calls = wrap_phases()

    def report() -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        REPORT.write_text(
            json.dumps(
                {
                    "spent": dict(spent),
                    "calls": dict(calls),
                    "process_cpu": usage.ru_utime + usage.ru_stime,
                }
            )
        )

    atexit.register(report)
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *sys.argv[2:]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    args = parser.parse_args()
    from tests.benchmarks import jobs as harness

    harness.WORKER_COMMAND[:] = [
        sys.executable,
        "-m",
        "tests.benchmarks.jobs_phases",
        "_worker",
        *harness.WORKER_COMMAND[2:],
    ]
    harness.setup_django()
    REPORT.unlink(missing_ok=True)
    harness.bench_ours(args.jobs, 1)
    per_job = harness.CPU[(1, harness.DEFAULT_ATTEMPTS, True)][-1][1]
    report = json.loads(REPORT.read_text())
    jobs = report["calls"].get("Running.run_one") or args.jobs
    print(
        f"\njobs_worker, one process, {args.jobs} no-op jobs: {per_job * 1e6:.0f} µs of CPU a job"
    )
    print("over the drain (the benchmark's measure, from outside)\n")
    print("| phase (inclusive) | µs a job | calls |")
    print("|---|---:|---:|")
    for name, seconds in sorted(report["spent"].items(), key=lambda item: -item[1]):
        print(f"| `{name}` | {seconds / jobs * 1e6:.1f} | {report['calls'][name]} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["_worker"]:
        worker()
    else:
        main()
