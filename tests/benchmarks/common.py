"""What the benchmark harnesses share."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

# Every harness measures production-like processes: with Django's DEBUG on, each query
# goes through the debug cursor (timed, formatted and kept in connection.queries),
# which costs ours, Celery and django-tasks-db alike CPU no deployment pays. The
# testproject's settings default DEBUG to on for the demo; the benchmarks turn it off
# for themselves and for every process they start.
os.environ.setdefault("DEBUG", "0")


def ensure_database(url: str) -> None:
    """Create the PostgreSQL database of *url* if it does not exist (each benchmark
    has one of its own)."""
    import psycopg

    name = url.rsplit("/", 1)[1]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def recreate_database(url: str) -> None:
    """Drop the PostgreSQL database of *url* if it exists, and create it empty."""
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(url: str) -> None:
    """Close Django's connections and drop the PostgreSQL database of *url*."""
    import psycopg
    from django.db import connections

    connections.close_all()
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def rates_in_turns(
    bodies: Mapping[str, Callable[[int], None]], transactions: int, against: str, rounds: int = 10
) -> dict[str, tuple[float, float]]:
    """Calls per second of each of *bodies* (``body(n)``: one business transaction), in
    *rounds* rounds that take turns; each round starts with another body, so none is
    always the first after a pause. By name: the median rate, and the median of each
    round's own ratio to *against*'s rate in that round. The machine's speed drifts
    between rounds far more than within one; within a round it shifts every body alike.
    """
    for body in bodies.values():
        body(-1)  # warm up connections and caches
    rates: dict[str, list[float]] = {name: [] for name in bodies}
    names = list(bodies)
    count = max(transactions // rounds, 1)
    for turn in range(rounds):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            body = bodies[name]
            started = time.perf_counter()
            for n in range(count):
                body(n)
            rates[name].append(count / (time.perf_counter() - started))
    return {
        name: (
            statistics.median(values),
            statistics.median(v / a for v, a in zip(values, rates[against], strict=True)),
        )
        for name, values in rates.items()
    }


def process_cpu(pids: list[int]) -> float:
    """CPU seconds (user and system, every thread) that the running processes *pids*
    have used so far, read from ``/proc`` (Linux; 0 elsewhere). Read before and after a
    drain, it measures a worker's CPU over the drain alone, without its start-up."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                # The name (2nd field) may hold spaces: count fields after its ")".
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def server_cpu(name: str = "postgres") -> float:
    """CPU seconds every process called *name* on this machine (the database server's
    backends and its background processes) has used so far, from ``/proc`` (Linux; 0
    elsewhere). Read before and after a drain, it is the server's share of the work."""
    pids = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as comm:
                if comm.read().strip() == name:
                    pids.append(int(entry))
        except OSError:
            continue
    return process_cpu(pids)


def instructions(
    module: str, arguments: list[str], cwd: Any, env: dict[str, str] | None, smoke: bool
) -> int:
    """Instructions valgrind (callgrind) counted in ``python -m module *arguments*``. With
    *smoke* the process runs without valgrind and 0 is returned (a harness's CI run)."""
    import re
    import subprocess
    import sys

    command = [] if smoke else ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    command += [sys.executable, "-m", module, *arguments]
    run = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({run.returncode}): {run.stderr[-2000:]}")
    if smoke:
        return 0
    found = re.search(r"Collected : (\d+)", run.stderr)
    if found is None:
        raise RuntimeError(f"valgrind printed no count: {run.stderr[-2000:]}")
    return int(found.group(1))


def add_counting_arguments(
    parser: Any, child: tuple[str, ...], variants: dict[str, str] | None = None
) -> None:
    """The options of a harness that counts instructions with valgrind: ``--smoke`` (its
    children run without valgrind, nothing counted: CI), ``--child`` (one child's work,
    *child* naming its values) and, with *variants*, ``--variants`` (which to count)."""
    if variants is not None:
        parser.add_argument(
            "--variants",
            default=",".join(variants),
            help=f"Which to count, comma-separated, of {', '.join(variants)} (default: all).",
        )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="Run the child processes without valgrind and count nothing (CI: the harness runs).",
    )
    parser.add_argument("--child", nargs=len(child), metavar=child)


def valgrind_missing(smoke: bool) -> bool:
    """Whether valgrind is needed (not *smoke*) and not installed; says so on stderr."""
    import shutil
    import sys

    if smoke or shutil.which("valgrind") is not None:
        return False
    print("valgrind is not installed (Debian: apt install valgrind)", file=sys.stderr)
    return True


def count_variants(
    parser: Any,
    args: Any,
    variants: dict[str, str],
    counted: Any,
    *,
    count: int,
    item: str,
    title: str,
) -> int:
    """A counting harness's ``main()`` after its arguments are read: count each of the
    chosen ``--variants`` (*variants*: name → label) with *counted* (``counted(variant,
    count, worked, smoke)``: a child process's instructions, with its *count* items
    worked or only made ready), and print one *item*'s instructions a variant, the first
    variant's ratio to each, under *title*. Returns the exit status."""
    import sys
    from datetime import date

    if valgrind_missing(args.smoke):
        return 2
    chosen = [name.strip() for name in args.variants.split(",") if name.strip()]
    if set(chosen) - set(variants) or not chosen:
        parser.error(f"--variants takes {', '.join(variants)}; got {args.variants!r}")
    if not args.smoke:
        # Once without valgrind first: a child creates and migrates the benchmark's
        # database when it is missing, which counted in the first child made that
        # variant's figure a draw (negative, or twice the next run's).
        counted(chosen[0], count, False, True)
    per_item = {}
    for variant in chosen:
        ready, worked = (counted(variant, count, run, args.smoke) for run in (False, True))
        per_item[variants[variant]] = (worked - ready) / count
    if args.smoke:
        print(f"smoke run: {', '.join(chosen)}, {count} {item}s each, without valgrind")
        return 0
    print(f"\n{date.today()} · valgrind (callgrind) · Python {sys.version.split()[0]} · {title}\n")
    first = next(iter(variants.values()))
    ours = per_item.get(first)
    print(f"| variant | instructions a {item} | {first}'s of it |")
    print("|---|---:|---:|")
    for label, instructions in per_item.items():
        ratio = f"{ours / instructions:.2f}x" if ours is not None else "-"
        print(f"| {label} | {instructions:,.0f} | {ratio} |")
    return 0
