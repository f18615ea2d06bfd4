"""The health checks: each part's figures judged ok, warning or critical.

Four checks per part, their thresholds in ``DJANGO_OUTBOX['HEALTH']``:

- ``oldest_due``: the oldest due row has waited ``OLDEST_DUE_WARNING_SECONDS`` (60)
  or ``OLDEST_DUE_CRITICAL_SECONDS`` (600): the workers do not keep up, or none runs.
- ``dead_lettered``: rows dead-lettered (or held as uncertain) in the last
  ``DEAD_LETTERED_MINUTES`` (15), from ``DEAD_LETTERED_WARNING`` (1) or
  ``DEAD_LETTERED_CRITICAL`` (100) on: they wait for an operator.
- ``workers``: critical when rows have been due for ``NO_WORKER_SECONDS`` (30) and no
  live worker takes the part's rows, or when rows of dead workers wait for a rescue
  and no live worker is there to rescue them; a warning while rows wait for a rescue
  (the live workers' heartbeats take them within seconds), or are due, for less than
  ``NO_WORKER_SECONDS``, with no worker yet.
- ``sweep``: the part has rows to recover and its sweep has not run for
  ``SWEEP_STALE_SECONDS`` (60, a warning) or ``SWEEP_LATE_CRITICAL_SECONDS`` (600).

A report is as bad as its worst check: the probe answers 503 when it is critical
(200 otherwise), ``outbox_stats`` exits 0, 1 or 2 (Nagios' ok, warning, critical).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django_outbox.conf import Settings, get_settings
from django_outbox.health.figures import Health, PartFigures

OK = "ok"
WARNING = "warning"
CRITICAL = "critical"
_RANK = {OK: 0, WARNING: 1, CRITICAL: 2}
#: Nagios' exit codes (3, "unknown", is for figures that could not be read).
EXIT_CODES = {OK: 0, WARNING: 1, CRITICAL: 2}
UNKNOWN_EXIT_CODE = 3


@dataclass(frozen=True)
class Check:
    """One check of one part."""

    part: str
    name: str
    status: str
    message: str
    #: The figure judged (seconds, rows), where there is one.
    value: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "part": self.part,
            "check": self.name,
            "status": self.status,
            "message": self.message,
            "value": self.value,
        }


@dataclass(frozen=True)
class Report:
    """Every check, the worst status, and the figures they were made from."""

    status: str
    checks: tuple[Check, ...]
    health: Health

    @property
    def http_status(self) -> int:
        """503 when critical (a load balancer takes the service out), else 200."""
        return 503 if self.status == CRITICAL else 200

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def problems(self) -> list[Check]:
        """The checks that are not ok, worst first."""
        bad = [check for check in self.checks if check.status != OK]
        return sorted(bad, key=lambda check: -_RANK[check.status])

    def summary(self) -> str:
        """One line: the status, and what is wrong."""
        problems = self.problems()
        if not problems:
            return f"{self.status.upper()}: {', '.join(self.health.parts) or 'no part'} healthy"
        said = "; ".join(f"{check.part}: {check.message}" for check in problems)
        return f"{self.status.upper()}: {said}"

    def as_dict(self, *, figures: bool = True) -> dict[str, Any]:
        body: dict[str, Any] = {
            "status": self.status,
            "checks": [check.as_dict() for check in self.checks],
        }
        if figures:
            body.update(self.health.as_dict())
        return body


def evaluate(health: Health, config: Settings | None = None) -> Report:
    """Judge *health* against the ``HEALTH`` thresholds."""
    config = config or get_settings()
    checks = []
    for figures in health.parts.values():
        checks += [
            _oldest_due(figures, config),
            _dead_lettered(figures, config),
            _workers(figures, config),
            _sweep(figures, config),
        ]
    worst = max((check.status for check in checks), key=_RANK.__getitem__, default=OK)
    return Report(status=worst, checks=tuple(checks), health=health)


def _oldest_due(figures: PartFigures, config: Settings) -> Check:
    limits = config.health
    age = figures.oldest_due_seconds
    if age is None:
        return Check(figures.part, "oldest_due", OK, "nothing is due", 0.0)
    said = f"the oldest due row has waited {_duration(age)} ({figures.due} due)"
    if age >= limits.oldest_due_critical_seconds:
        status = CRITICAL
        said += f", critical from {_duration(limits.oldest_due_critical_seconds)}"
    elif age >= limits.oldest_due_warning_seconds:
        status = WARNING
        said += f", warning from {_duration(limits.oldest_due_warning_seconds)}"
    else:
        status = OK
    return Check(figures.part, "oldest_due", status, said, round(age, 3))


def _dead_lettered(figures: PartFigures, config: Settings) -> Check:
    limits = config.health
    count = figures.dead_lettered_recent
    said = f"{count} row(s) dead-lettered or held in the last {limits.dead_lettered_minutes} min"
    if count >= limits.dead_lettered_critical:
        return Check(
            figures.part,
            "dead_lettered",
            CRITICAL,
            f"{said}, critical from {limits.dead_lettered_critical}",
            count,
        )
    if count >= limits.dead_lettered_warning:
        return Check(
            figures.part,
            "dead_lettered",
            WARNING,
            f"{said}, warning from {limits.dead_lettered_warning}",
            count,
        )
    return Check(figures.part, "dead_lettered", OK, said, count)


def _workers(figures: PartFigures, config: Settings) -> Check:
    live = figures.live_workers
    waited = figures.oldest_due_seconds
    grace = config.health.no_worker_seconds
    name, part = "workers", figures.part
    if not live and figures.stuck:
        return Check(
            part,
            name,
            CRITICAL,
            f"{figures.stuck} row(s) of dead workers wait for a rescue and no live worker "
            f"takes {part} rows",
            0,
        )
    if not live and waited is not None and waited >= grace:
        return Check(
            part,
            name,
            CRITICAL,
            f"rows have been due for {_duration(waited)} and no live worker takes {part} rows",
            0,
        )
    if figures.stuck:
        return Check(
            part,
            name,
            WARNING,
            f"{figures.stuck} row(s) of dead workers (or past their lease) wait for a rescue",
            live,
        )
    if not live and waited is not None:
        return Check(
            part,
            name,
            WARNING,
            f"rows are due and no live worker takes {part} rows yet (critical after "
            f"{_duration(grace)})",
            0,
        )
    return Check(part, name, OK, f"{live} live worker(s)", live)


def _sweep(figures: PartFigures, config: Settings) -> Check:
    sweep = figures.sweep
    silent = sweep.silent_seconds
    if not sweep.late:
        if silent is None:
            return Check(figures.part, "sweep", OK, "never swept (nothing waits)", None)
        said = f"swept {_duration(silent)} ago" + ("" if sweep.needed else " (nothing waits)")
        return Check(figures.part, "sweep", OK, said, round(silent, 3))
    if silent is None:
        return Check(figures.part, "sweep", WARNING, "rows wait and no sweep has ever run", None)
    critical = config.health.sweep_late_critical_seconds
    status = CRITICAL if silent >= critical else WARNING
    return Check(
        figures.part,
        "sweep",
        status,
        f"rows wait and the last sweep ran {_duration(silent)} ago (late after "
        f"{_duration(config.sweep_stale_seconds)}, critical after {_duration(critical)})",
        round(silent, 3),
    )


def _duration(seconds: float) -> str:
    """``"4.2 s"``, ``"75 s"``, ``"12 min"``, ``"3.5 h"``."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 300:
        return f"{seconds:.0f} s"
    if seconds < 3 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


__all__ = [
    "CRITICAL",
    "EXIT_CODES",
    "OK",
    "UNKNOWN_EXIT_CODE",
    "WARNING",
    "Check",
    "Report",
    "evaluate",
]
