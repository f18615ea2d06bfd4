"""Every performance target of issue 17 in one run, and one table of verdicts.

    python -m tests.benchmarks.targets            # make bench-targets: about half an hour
    python -m tests.benchmarks.targets --reduced  # make test's sizes: informational

Runs the harnesses one after the other (never two at once: each needs the machine to
itself), each as ``make bench``, ``make bench-jobs``, ``make bench-inbox`` and ``make
bench-webhook`` run it, with its whole output shown as it comes. Each harness judges
its own targets side by side with its lean loop in the same run and prints a verdict
line per target; this collects those lines into one table at the end, with the
harness's command, so a reader sees which target was met on this machine today and
how to measure it again. A missed target is a finding, not a failure: the exit status
is not zero only if a harness itself failed.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path

#: The project's root, where each harness runs (not imported from a harness: importing
#: one sets its environment variables, which every child would then inherit).
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Harness:
    name: str
    module: str
    full: tuple[str, ...]
    reduced: tuple[str, ...]
    #: Whether its reduced run prints verdicts (latency's reduced rate has no target).
    judged_reduced: bool = True

    def command(self, reduced: bool) -> list[str]:
        return ["-m", self.module, *(self.reduced if reduced else self.full)]


#: In issue 17's order: relay, RabbitMQ, send() (relay); latency; jobs and enqueue();
#: inbox; webhook. The full sizes are the ``make bench*`` ones; the reduced ones are
#: ``make test``'s (``bench-ci``).
HARNESSES = (
    Harness(
        "relay",
        "tests.benchmarks.relay",
        ("--messages", "100000", "--repeat", "3"),
        (
            "--messages", "5000", "--repeat", "1", "--transactions", "500",
            "--rss-backlogs", "10000,50000", "--peer-messages", "0", "--informational",
        ),
    ),
    Harness(
        "latency",
        "tests.benchmarks.latency",
        ("--rates", "300,500", "--seconds", "10", "--repeat", "3"),
        ("--rates", "200", "--seconds", "2", "--brokers", "redis", "--informational"),
        judged_reduced=False,
    ),
    Harness(
        "jobs",
        "tests.benchmarks.jobs",
        ("--jobs", "60000", "--repeat", "3"),
        (
            "--jobs", "3000", "--celery-tasks", "500", "--db-worker-tasks", "100",
            "--transactions", "200", "--latency-seconds", "2", "--repeat", "1",
            "--informational",
        ),
    ),
    Harness(
        "inbox",
        "tests.benchmarks.inbox",
        ("--messages", "60000", "--processes", "2", "--repeat", "3"),
        ("--messages", "3000", "--processes", "2", "--repeat", "1", "--informational"),
    ),
    Harness(
        "webhook",
        "tests.benchmarks.webhook",
        (
            "--requests", "6000", "--repeat", "3", "--rate", "500", "--seconds", "10",
            "--batches", "1,100",
        ),
        ("--requests", "500", "--repeat", "1", "--rate", "100", "--seconds", "2",
         "--informational"),
    ),
)  # fmt: skip

#: The verdict lines the harnesses print: ``target NAME: met|MISSED[ note]`` (jobs,
#: inbox, webhook) and ``- NAME: met|missed`` (relay, latency); the jobs harness says
#: ``not run (why)`` of a target whose peer is not installed.
VERDICT = re.compile(
    r"^(?:target |- )(?P<target>.+): (?P<verdict>met|MISSED|missed|not run)(?:\b|$)"
)


def verdicts(output: str) -> list[tuple[str, str]]:
    """The (target, verdict) pairs in a harness's *output*, in the order printed; the
    verdict is ``met``, ``missed`` or ``not run``."""
    found = []
    for line in output.splitlines():
        match = VERDICT.match(line.strip())
        if match:
            found.append((match["target"], match["verdict"].lower()))
    return found


def run(harness: Harness, reduced: bool) -> tuple[int, str]:
    """Run *harness*, its output shown as it comes; its exit status and its output."""
    command = [sys.executable, *harness.command(reduced)]
    print(f"\n$ python {' '.join(harness.command(reduced))}", flush=True)
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},  # its lines as they come
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    assert process.stdout is not None
    for line in process.stdout:
        sys.stdout.write(line)
        lines.append(line)
    sys.stdout.flush()
    return process.wait(), "".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reduced", action="store_true", help="make test's sizes (informational figures)."
    )
    parser.add_argument(
        "--only",
        default=",".join(h.name for h in HARNESSES),
        help="Which harnesses, comma-separated, of " + ", ".join(h.name for h in HARNESSES),
    )
    args = parser.parse_args()
    chosen = args.only.split(",")
    unknown = sorted(set(chosen) - {h.name for h in HARNESSES})
    if unknown:
        parser.error(f"unknown harness(es): {', '.join(unknown)}")
    rows: list[tuple[Harness, str, str]] = []
    failed = []
    for harness in HARNESSES:
        if harness.name not in chosen:
            continue
        status, output = run(harness, args.reduced)
        if status != 0:
            failed.append(f"{harness.name} (exit status {status})")
            continue
        found = verdicts(output)
        if not found and (harness.judged_reduced or not args.reduced):
            failed.append(f"{harness.name} (printed no verdict)")
        rows += [(harness, target, verdict) for target, verdict in found]
    print(
        f"\n{date.today()} · {os.cpu_count()} cores · Python {platform.python_version()}"
        + (" · reduced run: informational, not comparable with the targets" if args.reduced else "")
    )
    print("\n| harness | target | verdict |")
    print("|---|---|---|")
    for harness, target, verdict in rows:
        shown = "**missed**" if verdict == "missed" else verdict
        print(f"| `{harness.name}` | {target} | {shown} |")
    print("\nCommands (from the project's root, `.venv/bin/python`):\n")
    for harness in HARNESSES:
        if harness.name in chosen:
            print(f"- {harness.name}: `python {' '.join(harness.command(args.reduced))}`")
    if failed:
        print(f"\nharness(es) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
