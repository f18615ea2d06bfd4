"""Maintenance sweeps of any part: rescue rows of dead holders, purge finished rows.

Each sweep does one bounded pass, returns counts, and logs only when it
changed something. Times are the database's (see ``engine.clock``).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, transaction
from django.db.models import DurationField, ExpressionWrapper, F, Field, Q

from django_outbox.conf import get_settings
from django_outbox.engine import clock, faults, partitions, telemetry, transitions
from django_outbox.engine.lease import declared_started
from django_outbox.engine.models import SweepMark
from django_outbox.engine.outcomes import Uncertain
from django_outbox.engine.part import Part, registered
from django_outbox.engine.purge import purge_in_batches


@dataclass(frozen=True)
class RescueResult:
    """What one rescue did with the rows of dead holders."""

    #: Rows made ready again: given back before their attempt started, or retried
    #: after an attempt their worker did not live to finish.
    ready: int = 0
    #: Rows parked for an operator: held as uncertain, or dead-lettered because their
    #: attempts were used up.
    held: int = 0

    @property
    def resent(self) -> int:
        """The rows made ready again (the outbox's name for them)."""
        return self.ready

    @property
    def total(self) -> int:
        return self.ready + self.held


#: Rows a rescue takes per statement (it loops until none are left).
RESCUE_CHUNK = 500


def rescue_stuck(
    part: Part, *, dead_workers: Sequence[uuid.UUID] = (), at: datetime | None = None
) -> RescueResult:
    """Recover running rows whose lease expired or whose worker is dead.

    A row its holder had not started (no attempt declared) goes back uncounted. A
    row whose attempt had started ended uncleanly: its outcome is uncertain (the step
    may or may not have happened), and it is recorded like any uncertain outcome (the
    engine's transitions: retried now, held where the part holds uncertain rows,
    dead-lettered once its own attempts are used up, its key parked), and marked to run
    alone next time. Clearing the lease token fences the old holder out: whatever it
    records later changes nothing.

    Lock-mode parts (the inbox) have no running rows: a dead worker's claims are
    simply released (their transaction died with the worker; the attempt stays counted).
    """
    life = part.lifecycle
    if life.running is None:
        released = _release_locked_claims(part, dead_workers) if dead_workers else 0
        if not dead_workers:
            mark_swept(part)
        return RescueResult(ready=released)
    # Read once and written as a value: the hooks (a job's task_finished) see the times
    # that were stored.
    now = clock.now(at if at is not None else clock.read_now(part.using))
    lost = Q(locked_until__lt=now)
    if dead_workers:
        lost |= Q(claimed_by__in=list(dead_workers))
    stuck = part.model._default_manager.using(part.using).filter(lost, state=life.running)
    cause = "its worker stopped" if dead_workers else "its lease expired"
    ready = held = 0
    failed: list[transitions.Change] = []
    kill_point = f"{part.name}.in_rescue"
    while True:
        with transaction.atomic(using=part.using):
            rows = list(stuck.select_for_update(skip_locked=True).order_by("pk")[:RESCUE_CHUNK])
            if not rows:
                break
            started = declared_started(part.using, rows)
            changes = [_rescued(part, row, row.pk in started, cause, now) for row in rows]
            # The rows are locked by this transaction (SQLite: it is the only writer):
            # nobody records them meanwhile.
            locked = part.model._default_manager.using(part.using).filter(
                pk__in=[row.pk for row in rows], state=life.running
            )
            applied = transitions.apply(part, locked, changes)
            faults.point(kill_point)  # the rescue is written, not committed
        ready += applied.count(transitions.Transition.RETRY_LATER, transitions.Transition.RELEASE)
        held += applied.count(transitions.Transition.HOLD, transitions.Transition.DEAD_LETTER)
        failed.extend(change for change in applied.written if change.failed)
        if len(rows) < RESCUE_CHUNK:
            break
    result = RescueResult(ready=ready, held=held)
    if not dead_workers:
        mark_swept(part)
    if result.total:
        part.logger.warning(
            "rescued %d %s row(s) (%s): %d ready again, %d held or dead-lettered",
            result.total,
            part.name,
            cause,
            ready,
            held,
        )
        telemetry.rescued(part, result.total)
        # The attempts the rescue counted as failed (retried, held, dead-lettered).
        telemetry.recorded(part, failed)
        transitions.bring_up_to_date(failed)
        for change in failed:
            part.on_failed(change.row, change.error, change.will_retry)
        part.on_rescued(result)
    return result


def _rescued(
    part: Part, row: Any, started: bool, cause: str, now: clock.Instant
) -> transitions.Change:
    """What becomes of one stuck row: given back if its attempt never started, else its
    attempt is counted and recorded as ended uncleanly (and it runs alone next time)."""
    if not started:
        return transitions.release(part, row)
    row.attempts += 1
    note = (
        f"{cause} during attempt {row.attempts} (killed, out of memory, frozen or cut off): "
        "outcome uncertain"
    )
    details = {"worker_lost": True, "worker": str(row.claimed_by or "")}
    change = transitions.decide(part, row, Uncertain(note, details, delay=0.0), now)
    change.values["attempts"] = row.attempts
    change.values["unclean_end"] = True
    return change


def _release_locked_claims(part: Part, dead_workers: Sequence[uuid.UUID]) -> int:
    """Lock mode: clear the claims of dead workers so their rows are due at once (their
    batch's transaction died with them; the attempt it counted stays counted)."""
    rows = part.model._default_manager.using(part.using).filter(
        state=part.lifecycle.ready, claimed_by__in=list(dead_workers)
    )
    released = 0
    while True:
        with transaction.atomic(using=part.using):
            ids = list(
                rows.select_for_update(skip_locked=True)
                .order_by("pk")
                .values_list("pk", flat=True)[:RESCUE_CHUNK]
            )
            if not ids:
                return released
            released += (
                part.model._default_manager.using(part.using)
                .filter(pk__in=ids, claimed_by__in=list(dead_workers))
                .update(**transitions.LEASE_CLEARED)
            )
        if len(ids) < RESCUE_CHUNK:
            return released


def purge_finished(
    part: Part,
    *,
    older_than: timedelta | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    at: datetime | None = None,
) -> int:
    """Delete finished rows of *part* older than *older_than* (``RETENTION_DAYS``).

    A partitioned table (``engine.partitions``) first gets the partitions of the coming
    ``PARTITIONS_AHEAD`` intervals, and loses those whose every row finished before the
    cut-off, dropped whole; the rows left past it are deleted as usual."""
    config = part.config
    age = older_than if older_than is not None else timedelta(days=config.retention_days)
    before = clock.later(clock.now(at), -age.total_seconds())
    dropped = 0
    rows = part.model._default_manager.using(part.using).filter(
        state__in=part.lifecycle.finished, finished_at__lt=before
    )
    shape = partitions.layout(part.model, part.using)
    if shape is not None:
        partitions.create_ahead(part.model, part.using, config.partitions_ahead)
        cutoff = (at or clock.read_now(part.using)) - age
        dropped = len(partitions.drop_expired(part.model, part.using, _expiry(part), cutoff))
        # A row of an interval not wholly past the cut-off goes with its partition, later
        # (kept up to one interval longer than RETENTION_DAYS); the rows deleted one by
        # one are those of past partitions kept for a row still waiting, and of the
        # default partition.
        rows = rows.filter(created_at__lt=partitions.floor(cutoff, shape.interval))
    if part.ordering is not None:
        # A failed row that holds its key back waits for an operator, however old: its
        # parked followers would otherwise wait for ever.
        rows = rows.exclude(blocking=True)
    deleted = purge_in_batches(
        rows, batch_size=batch_size or config.purge_batch_size, max_batches=max_batches
    )
    if deleted:
        part.logger.info("purged %d finished %s row(s)", deleted, part.name)
    if dropped:
        part.logger.info("dropped %d partition(s) of finished %s rows", dropped, part.name)
    return deleted


def _expiry(part: Part) -> partitions.Expiry:
    life = part.lifecycle
    field = part.model._meta.get_field("state")
    assert isinstance(field, Field)
    assert field.choices is not None
    states = [str(choice) for choice, _ in field.choices]
    return partitions.Expiry(
        finished=tuple(life.finished),
        unfinished=tuple(state for state in states if state not in life.finished),
        blocking=part.ordering is not None,
        state_column="state",
        finished_column=partitions.column_of(part.model, "finished_at"),
    )


def mark_swept(part: Part) -> None:
    """Stamp *part*'s sweep mark with the database's clock (an INSERT the first time)."""
    marks = SweepMark.objects.using(part.using)
    values = {"last_run_at": clock.now(), "ran_by": f"{socket.gethostname()}:{os.getpid()}"[:255]}
    if marks.filter(part=part.name).update(**values):
        return
    try:
        with transaction.atomic(using=part.using):
            marks.create(part=part.name, **values)
    except IntegrityError:
        # Another sweep created it meanwhile.
        marks.filter(part=part.name).update(**values)


@dataclass(frozen=True)
class StaleSweep:
    """A part with unfinished rows whose sweep has not run for ``SWEEP_STALE_SECONDS``."""

    part: str
    #: When its sweep last ran (``None``: never, in this database).
    last_run_at: datetime | None
    #: Seconds since then (``None``: never).
    silent_for: float | None

    def describe(self) -> str:
        since = (
            "no sweep has ever run"
            if self.silent_for is None
            else f"its last sweep ran {self.silent_for:.0f} s ago"
        )
        part = registered().get(self.part)
        sweepers = part.sweepers if part is not None else "its sweep"
        return (
            f"{self.part} has unfinished rows and {since}: rows whose trigger was lost or whose "
            f"lease expired are not being recovered. Is something running {sweepers}?"
        )


def stale_sweeps(using: str = DEFAULT_DB_ALIAS) -> list[StaleSweep]:
    """The registered parts that have unfinished rows but no recent sweep."""
    limit = get_settings().sweep_stale_seconds
    age = ExpressionWrapper(clock.now() - F("last_run_at"), output_field=DurationField())
    marks = {
        part: (last, silent.total_seconds())
        for part, last, silent in SweepMark.objects.using(using)
        .annotate(silent=age)
        .values_list("part", "last_run_at", "silent")
    }
    stale = []
    for name, part_class in registered().items():
        last, silent_for = marks.get(name, (None, None))
        if silent_for is not None and silent_for < limit:
            continue
        if _has_unfinished(part_class, using):
            stale.append(StaleSweep(part=name, last_run_at=last, silent_for=silent_for))
    return stale


def _has_unfinished(part_class: type[Part], using: str) -> bool:
    """Whether *part_class* has rows waiting or running: one ``EXISTS`` per state (and,
    where rows can be parked, per ``blocked`` value), each answered by a partial index
    of that state. ``state IN (…)`` matches none of them: PostgreSQL would read the
    whole table when no row waits (seconds at millions of finished rows)."""
    life = part_class.lifecycle
    rows = part_class.model._default_manager.using(using)
    parks = any(field.name == "blocked" for field in part_class.model._meta.concrete_fields)
    for state in (life.ready, life.running):
        if state is None:
            continue
        in_state = rows.filter(state=state)
        if state == life.ready and parks:
            if in_state.filter(blocked=False).exists() or in_state.filter(blocked=True).exists():
                return True
        elif in_state.exists():
            return True
    return False
