"""What the benchmark harnesses share."""

from __future__ import annotations

import os
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


def add_counting_arguments(parser: Any, child: tuple[str, ...]) -> None:
    """The options of a harness that counts instructions with valgrind: ``--smoke`` (its
    children run without valgrind, nothing counted: CI) and ``--child`` (one child's
    work, *child* naming its values)."""
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
