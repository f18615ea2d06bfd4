"""``manage.py outbox_stats``: the health page's figures and checks, for cron and scripts.

Exits as a Nagios plugin does: 0 ok, 1 warning, 2 critical (the worst check, see
``health.status``), 3 when the figures could not be read. The first line says the
status and what is wrong; ``--json`` prints the health probe's body instead (with the
failure groups).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DEFAULT_DB_ALIAS, DatabaseError
from django.utils import timezone

from django_outbox.health import figures, status
from django_outbox.health.figures import PartFigures, WorkerFigures


class Command(BaseCommand):
    help = (
        "Print the health of the outbox, the inbox and the jobs (the admin's health page "
        "in text, or --json) and exit 0 (ok), 1 (warning), 2 (critical) or 3 (the database "
        "could not be read), as a Nagios plugin does."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)
        parser.add_argument(
            "--part",
            action="append",
            dest="parts",
            choices=figures.PARTS,
            default=None,
            help="Only this part (repeatable; default: all three).",
        )
        parser.add_argument(
            "--json", action="store_true", help="Print one JSON object (the probe's body)."
        )
        parser.add_argument(
            "--no-failures",
            action="store_true",
            help="Leave the failure groups out (they read the newest failed rows' errors).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            health = figures.read(
                options["database"], parts=options["parts"], failures=not options["no_failures"]
            )
        except DatabaseError as exc:
            self.stderr.write(f"UNKNOWN: the database could not be read: {exc}")
            raise SystemExit(status.UNKNOWN_EXIT_CODE) from exc
        report = status.evaluate(health)
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), sort_keys=True))
        else:
            self.stdout.write(render(report))
        if report.exit_code:
            raise SystemExit(report.exit_code)


def render(report: status.Report) -> str:
    """The report as text: the status line, each part, then the workers."""
    lines = [f"django-outbox {report.summary()}"]
    for name, part in report.health.parts.items():
        lines += ["", name, *_part(part, [c for c in report.checks if c.part == name])]
    workers = report.health.workers
    lines += ["", "workers" if workers else "workers: none"]
    lines += [f"  {_worker(worker)}" for worker in workers]
    return "\n".join(lines)


def _part(part: PartFigures, checks: list[status.Check]) -> list[str]:
    states = " · ".join(f"{state} {count}" for state, count in part.states.items())
    due = f"due {part.due}"
    if part.oldest_due_seconds is not None:
        due += f", the oldest for {part.oldest_due_seconds:.0f} s"
    extras = [due]
    if part.parked is not None:
        extras.append(f"parked {part.parked} behind {part.parked_keys} key(s)")
    if part.uncertain is not None:
        extras.append(f"uncertain {part.uncertain}")
    if part.gaps is not None:
        extras.append(f"waiting for a gap {part.gaps}")
    if part.batches_running is not None:
        extras.append(f"batches running {part.batches_running}")
    activity = (
        f"last hour: {sum(part.throughput()):,} done, {sum(part.failure_rate()):,} failed "
        f"· held {part.held} ({part.stuck} stuck) · {part.live_workers} live worker(s)"
    )
    sweep = part.sweep
    swept = (
        "never swept"
        if sweep.silent_seconds is None
        else f"swept {sweep.silent_seconds:.0f} s ago by {sweep.ran_by}"
    )
    lines = [f"  {states}", f"  {' · '.join(extras)}", f"  {activity}", f"  {swept}"]
    if part.failures is not None and part.failures.groups:
        of = f"the newest {part.failures.examined:,}" + (" of more" if part.failures.capped else "")
        lines.append(f"  failures ({of} failed rows):")
        for group in part.failures.groups[:10]:
            example = group.example.strip().splitlines()[-1][:100] if group.example else ""
            lines.append(
                f"    {group.count:>6}  {group.kind} at {group.target}, "
                f"{_time(group.first_seen)} to {_time(group.last_seen)}: {example}"
            )
    lines += [f"  [{check.status.upper()}] {check.name}: {check.message}" for check in checks]
    return lines


def _worker(worker: WorkerFigures) -> str:
    said = f"{worker.name}: {worker.status}"
    if worker.silent_seconds is not None:
        said += f", beat {worker.silent_seconds:.1f} s ago"
    if worker.queues:
        said += f", queues {','.join(worker.queues)}"
    for held in worker.holds:
        said += f"; holds {held.rows} {held.part} row(s), {held.started} started"
        if held.since is not None:
            said += f" (since {_time(held.since)})"
        if held.stuck:
            said += f", {held.stuck} stuck: {held.why_stuck}"
    return said


def _time(moment: datetime | None) -> str:
    if moment is None:
        return "—"
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S")
