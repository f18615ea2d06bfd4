"""The figures of the three parts, read in one pass at a bounded cost: ``read()``.

Per part: the rows in each state, what is due and how long the oldest has waited,
rows parked behind a failed key (and how many keys), uncertain rows (the outbox),
messages waiting for a gap (the inbox), batches running (the jobs), the outcomes of
each of the last 60 minutes (the ``MinuteCount`` table the workers write, see
``engine.telemetry``), the rows held now and those stuck, the live workers that
take its rows, its last sweep, and its failure groups (``health.failures``). Across
parts: every worker, alive or dead, and what it holds, and for how long.

What it costs, whatever the size of the tables: counts stop at ``COUNT_CAP`` and
read partial indexes only (due, parked, running, failed, uncertain: migration 0016
adds the ones that were missing); the finished states of a table of
``LARGE_TABLE_ROWS`` or more are the planner's estimate on PostgreSQL; held rows are
looked for among at most ``HELD_SAMPLE`` rows (a lease part's running rows; for the
inbox, whose rows stay due while a worker handles them, the oldest due ones: claims
take the oldest first). About thirty short queries in all. On MySQL/MariaDB, which
have no partial indexes, the same counts go through the state-led indexes and the
finished states are capped counts.

Times are the database's (``clock.read_now``) unless a caller pins ``now``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS
from django.db.models import Min

from django_outbox.conf import Settings, get_settings
from django_outbox.engine import clock, holding, telemetry
from django_outbox.engine.models import SweepMark, Worker
from django_outbox.engine.part import Part, registered
from django_outbox.health import failures as failure_groups
from django_outbox.health.counting import (
    LARGE_TABLE_ROWS,
    Count,
    capped,
    estimated,
    table_rows,
)

#: The parts, in the order they are shown.
PARTS = ("outbox", "inbox", "jobs")
#: Minutes of per-minute outcomes read (the chart's width).
CHART_MINUTES = 60
#: Rows looked at, per part, to find the rows workers hold now.
HELD_SAMPLE = 2_000
#: Worker rows read at most.
WORKER_LIMIT = 500
#: What a Celery worker process calls itself: it runs the tasks of every part.
EVERY_PART = "celery"


@dataclass(frozen=True)
class Sweep:
    """A part's last sweep (``SweepMark``), and whether it is late: older than
    ``SWEEP_STALE_SECONDS`` (or never run) while the part has rows to recover."""

    last_run_at: datetime | None
    ran_by: str
    silent_seconds: float | None
    late: bool
    #: Whether the part has rows a sweep is for (ready or running ones).
    needed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "last_run_at": _iso(self.last_run_at),
            "ran_by": self.ran_by,
            "silent_seconds": self.silent_seconds,
            "late": self.late,
            "needed": self.needed,
        }


@dataclass(frozen=True)
class Holding:
    """The rows of one part that one worker holds now."""

    part: str
    rows: int
    #: Of those, the rows whose attempt has started (the others wait in its batch).
    started: int
    #: Of those, the rows nobody works on any more (``engine.holding.stuck``).
    stuck: int
    #: When the oldest attempt among them started (``None``: none has).
    since: datetime | None
    #: When the first of their leases runs out.
    lease_ends: datetime | None
    #: Why they are stuck (empty while they are worked on).
    why_stuck: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "part": self.part,
            "rows": self.rows,
            "started": self.started,
            "stuck": self.stuck,
            "since": _iso(self.since),
            "lease_ends": _iso(self.lease_ends),
            "why_stuck": self.why_stuck,
        }


@dataclass(frozen=True)
class WorkerFigures:
    """A worker process and what it holds. ``status``: ``alive`` (it beat within
    ``WORKER_TIMEOUT_SECONDS``), ``dead`` (it did not: its rows wait for a rescue),
    ``gone`` (its row was removed, rows it claimed remain) or ``no heartbeat`` (rows
    claimed by a process without one: a relay in a shell, a test)."""

    id: uuid.UUID | None
    name: str
    #: ``outbox``, ``inbox``, ``jobs`` (the worker commands), ``celery`` (every part),
    #: or ``""`` when not known.
    role: str
    #: The queues a ``jobs_worker`` takes (empty: every queue, or not known).
    queues: tuple[str, ...]
    started_at: datetime | None
    heartbeat_at: datetime | None
    silent_seconds: float | None
    status: str
    holds: tuple[Holding, ...] = ()

    def serves(self, part: str) -> bool:
        """Whether this worker takes rows of *part*."""
        return self.role in (part, EVERY_PART)

    @property
    def alive(self) -> bool:
        return self.status == "alive"

    @property
    def rows(self) -> int:
        return sum(held.rows for held in self.holds)

    @property
    def stuck(self) -> int:
        return sum(held.stuck for held in self.holds)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id) if self.id is not None else None,
            "name": self.name,
            "role": self.role,
            "queues": list(self.queues),
            "started_at": _iso(self.started_at),
            "heartbeat_at": _iso(self.heartbeat_at),
            "silent_seconds": self.silent_seconds,
            "status": self.status,
            "holds": [held.as_dict() for held in self.holds],
        }


@dataclass(frozen=True)
class PartFigures:
    """One part's figures (see the module's docstring for what each costs)."""

    part: str
    #: Rows per state, in the order of the part's states.
    states: Mapping[str, Count]
    #: Ready rows whose time has come (not parked). The inbox's include the messages
    #: being handled right now: they stay due until their batch commits.
    due: Count
    #: How long the oldest due row has waited (``None``: nothing is due).
    oldest_due_seconds: float | None
    #: Rows parked behind a failed row of their key, and the keys (parts with ordered
    #: keys: the outbox and the jobs; ``None`` elsewhere).
    parked: Count | None
    parked_keys: Count | None
    #: Failed messages held as uncertain (the outbox).
    uncertain: Count | None
    #: Messages of strict keys deferred while they wait for a missing sequence (the inbox).
    gaps: Count | None
    #: Batches whose jobs have not all finished (the jobs).
    batches_running: Count | None
    #: Outcomes per minute of the last ``CHART_MINUTES`` minutes, oldest first, by event
    #: (``engine.telemetry.EVENTS``).
    per_minute: Mapping[str, list[int]]
    #: Rows dead-lettered or held in the last ``HEALTH['DEAD_LETTERED_MINUTES']``.
    dead_lettered_recent: int
    #: Rows workers hold now, and those of them stuck (waiting for a rescue).
    held: Count
    stuck: int
    #: Live workers that take this part's rows.
    live_workers: int
    sweep: Sweep
    failures: failure_groups.Failures | None = None

    def throughput(self) -> list[int]:
        """Rows done per minute."""
        return list(self.per_minute.get("done", [0] * CHART_MINUTES))

    def failure_rate(self) -> list[int]:
        """Failed attempts per minute: retried, dead-lettered or held."""
        series = [0] * CHART_MINUTES
        for event in ("retried", "dead", "held"):
            for slot, number in enumerate(self.per_minute.get(event, ())):
                series[slot] += number
        return series

    def as_dict(self) -> dict[str, Any]:
        optional = {
            "parked": self.parked,
            "parked_keys": self.parked_keys,
            "uncertain": self.uncertain,
            "gaps": self.gaps,
            "batches_running": self.batches_running,
        }
        return {
            "states": {state: count.as_dict() for state, count in self.states.items()},
            "due": self.due.as_dict(),
            "oldest_due_seconds": self.oldest_due_seconds,
            **{name: count.as_dict() for name, count in optional.items() if count is not None},
            "held": self.held.as_dict(),
            "stuck": self.stuck,
            "live_workers": self.live_workers,
            "dead_lettered_recent": self.dead_lettered_recent,
            "last_hour": {
                "done": sum(self.throughput()),
                "failed": sum(self.failure_rate()),
            },
            "sweep": self.sweep.as_dict(),
            **({"failures": self.failures.as_dict()} if self.failures is not None else {}),
        }


@dataclass(frozen=True)
class Health:
    """The figures of every part, and the workers, read at ``now``."""

    now: datetime
    parts: Mapping[str, PartFigures]
    workers: tuple[WorkerFigures, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        return {
            "now": _iso(self.now),
            "parts": {name: figures.as_dict() for name, figures in self.parts.items()},
            "workers": [worker.as_dict() for worker in self.workers],
        }


def read(
    using: str = DEFAULT_DB_ALIAS,
    *,
    parts: Iterable[str] | None = None,
    now: datetime | None = None,
    failures: bool = True,
) -> Health:
    """The figures of *parts* (default: all three) on database *using*, at *now* (default:
    the database's clock); with their failure groups unless *failures* is false."""
    config = get_settings()
    known = registered()
    wanted = set(parts) if parts is not None else set(PARTS)
    unknown = wanted - set(PARTS)
    if unknown:
        raise ValueError(f"unknown part(s) {', '.join(sorted(unknown))}; parts: {PARTS}")
    names = [name for name in PARTS if name in wanted and name in known]
    moment = now if now is not None else clock.read_now(using)
    instances = {name: known[name](using=using) for name in names}
    held = {name: _holders(part, moment) for name, part in instances.items()}
    workers = _workers(using, held, moment, config)
    minutes = telemetry.per_minute(
        using, minutes=CHART_MINUTES, parts=names, now=moment.timestamp()
    )
    marks = {mark.part: mark for mark in SweepMark.objects.using(using).filter(part__in=names)}
    figures = {
        name: _part(
            part,
            moment,
            config,
            minutes.get(name, {}),
            held[name],
            sum(1 for worker in workers if worker.alive and worker.serves(name)),
            marks.get(name),
            failures,
        )
        for name, part in instances.items()
    }
    return Health(now=moment, parts=figures, workers=tuple(workers))


def _part(
    part: Part,
    now: datetime,
    config: Settings,
    minutes: Mapping[str, list[int]],
    held: Mapping[Any, holding.Holder],
    live: int,
    mark: SweepMark | None,
    with_failures: bool,
) -> PartFigures:
    life = part.lifecycle
    rows = part.model._default_manager.using(part.using)
    large = (table_rows(part.model, part.using) or 0) >= LARGE_TABLE_ROWS
    ready = rows.filter(state=life.ready)
    parked = parked_keys = None
    if part.ordering is not None:
        # The due index leaves parked rows out, and the parked index has only them.
        parked_rows = ready.filter(blocked=True)
        parked = capped(parked_rows)
        keys = parked_rows.order_by().values(*part.ordering.key_fields).distinct()
        parked_keys = capped(keys)
        ready = ready.filter(blocked=False)
    states: dict[str, Count] = {}
    choices = part.model._meta.get_field("state").choices or ()  # type: ignore[union-attr]
    for value, _ in choices:
        state = str(value)
        if state == life.ready:
            states[state] = capped(ready) + parked if parked is not None else capped(ready)
        elif state in (life.running, life.failed):
            states[state] = capped(rows.filter(state=state))
        else:
            states[state] = estimated(rows.filter(state=state), large=large)
    due_rows = ready.filter(available_at__lte=now)
    oldest = due_rows.order_by().aggregate(oldest=Min("available_at"))["oldest"]
    series = {event: list(minutes.get(event, [0] * CHART_MINUTES)) for event in telemetry.EVENTS}
    window = config.health.dead_lettered_minutes
    recent = sum(sum(series[event][-window:]) for event in ("dead", "held"))
    waiting = [state for state in (life.ready, life.running) if state is not None]
    return PartFigures(
        part=part.name,
        states=states,
        due=capped(due_rows),
        oldest_due_seconds=_seconds(now, oldest),
        parked=parked,
        parked_keys=parked_keys,
        uncertain=_uncertain(part),
        gaps=_gaps(part, now),
        batches_running=_batches(part),
        per_minute=series,
        dead_lettered_recent=recent,
        held=Count(len(held), "capped" if len(held) >= HELD_SAMPLE else "exact"),
        stuck=sum(1 for holder in held.values() if holder.stuck),
        live_workers=live,
        sweep=_sweep(mark, now, config, unfinished=any(states[state] for state in waiting)),
        failures=failure_groups.read(part) if with_failures else None,
    )


def _sweep(mark: SweepMark | None, now: datetime, config: Settings, *, unfinished: bool) -> Sweep:
    """The part's last sweep; late by the rule of ``engine.sweeps.stale_sweeps``."""
    silent = _seconds(now, mark.last_run_at) if mark is not None else None
    stale = silent is None or silent >= config.sweep_stale_seconds
    return Sweep(
        last_run_at=mark.last_run_at if mark is not None else None,
        ran_by=mark.ran_by if mark is not None else "",
        silent_seconds=silent,
        late=stale and unfinished,
        needed=unfinished,
    )


def _uncertain(part: Part) -> Count | None:
    if part.name != "outbox":
        return None
    rows = part.model._default_manager.using(part.using)
    return capped(rows.filter(state=part.lifecycle.failed, uncertain=True))


def _gaps(part: Part, now: datetime) -> Count | None:
    if part.name != "inbox":
        return None
    # Deferred until their gap alert: the not-yet-due end of the due index.
    waiting = part.model._default_manager.using(part.using).waiting_for_gap()  # type: ignore[attr-defined]
    return capped(waiting.filter(available_at__gt=now))


def _batches(part: Part) -> Count | None:
    if part.name != "jobs":
        return None
    from django_outbox.jobs.models import JobBatch

    return capped(JobBatch.objects.using(part.using).filter(finished_at__isnull=True))


def _holders(part: Part, now: datetime) -> dict[Any, holding.Holder]:
    """The rows of *part* workers hold now, with their holders (``engine.holding``)."""
    life = part.lifecycle
    rows = part.model._default_manager.using(part.using)
    if life.running is not None:
        running = rows.filter(state=life.running).order_by()
        ids = list(running.values_list("pk", flat=True)[:HELD_SAMPLE])
    else:
        # Lock mode: a held row is still due, under a live lease; claims take the
        # oldest due rows first, so that is where they are.
        oldest = (
            rows.filter(state=life.ready, available_at__lte=now)
            .order_by("available_at", "pk")
            .values_list("pk", "locked_until")[:HELD_SAMPLE]
        )
        ids = [pk for pk, until in oldest if until is not None and until >= now]
    return holding.holders(part, ids)


def _workers(
    using: str,
    held: Mapping[str, Mapping[Any, holding.Holder]],
    now: datetime,
    config: Settings,
) -> list[WorkerFigures]:
    """Every worker row, alive or dead, with what it holds; then the holders of rows
    that have no worker row (gone, or a process without a heartbeat)."""
    timeout = config.worker_timeout_seconds
    holdings: dict[uuid.UUID | None, list[Holding]] = {}
    names: dict[uuid.UUID | None, str] = {}
    for part, holders in held.items():
        mine: dict[uuid.UUID | None, list[holding.Holder]] = {}
        for holder in holders.values():
            mine.setdefault(holder.worker, []).append(holder)
            if holder.name is not None:
                names[holder.worker] = holder.name
        for worker, found in mine.items():
            holdings.setdefault(worker, []).append(_holding(part, found))
    workers = []
    for row in Worker.objects.using(using).order_by("name")[:WORKER_LIMIT]:
        silent = _seconds(now, row.heartbeat_at)
        role, queues = _role(row.name)
        workers.append(
            WorkerFigures(
                id=row.id,
                name=row.name,
                role=role,
                queues=queues,
                started_at=row.started_at,
                heartbeat_at=row.heartbeat_at,
                silent_seconds=silent,
                status="alive" if silent is not None and silent <= timeout else "dead",
                holds=tuple(holdings.pop(row.id, ())),
            )
        )
    for worker, holds in holdings.items():
        workers.append(
            WorkerFigures(
                id=worker,
                name=names.get(worker) or ("—" if worker is None else str(worker)),
                role="",
                queues=(),
                started_at=None,
                heartbeat_at=None,
                silent_seconds=None,
                status="no heartbeat" if worker is None else "gone",
                holds=tuple(holds),
            )
        )
    return workers


def _holding(part: str, holders: list[holding.Holder]) -> Holding:
    started = [h.attempt_started for h in holders if h.attempt_started is not None]
    ends = [h.lease_ends for h in holders if h.lease_ends is not None]
    stuck = [h.stuck for h in holders if h.stuck]
    return Holding(
        part=part,
        rows=len(holders),
        started=len(started),
        stuck=len(stuck),
        since=min(started) if started else None,
        lease_ends=min(ends) if ends else None,
        why_stuck=stuck[0] if stuck else "",
    )


def _role(name: str) -> tuple[str, tuple[str, ...]]:
    """A worker's role and queues from its name: ``host:pid role [queue,queue]``."""
    words = name.split(" ")
    if len(words) < 2:
        return "", ()
    role = words[1]
    queues = tuple(q for q in words[2].split(",") if q) if len(words) > 2 else ()
    return role, queues


def _seconds(now: datetime, then: datetime | None) -> float | None:
    if then is None:
        return None
    return max(0.0, (now - then).total_seconds())


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


__all__ = [
    "CHART_MINUTES",
    "PARTS",
    "Health",
    "Holding",
    "PartFigures",
    "Sweep",
    "WorkerFigures",
    "read",
]
