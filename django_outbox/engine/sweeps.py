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

from django.db import DEFAULT_DB_ALIAS, IntegrityError, transaction
from django.db.models import DurationField, ExpressionWrapper, F, Q

from django_outbox.conf import get_settings
from django_outbox.engine import clock
from django_outbox.engine.models import SweepMark
from django_outbox.engine.part import Part, registered
from django_outbox.engine.purge import purge_in_batches


@dataclass(frozen=True)
class RescueResult:
    """What one rescue did: rows made ready again, rows parked for an operator."""

    resent: int = 0
    held: int = 0

    @property
    def total(self) -> int:
        return self.resent + self.held


def rescue_stuck(
    part: Part, *, dead_workers: Sequence[uuid.UUID] = (), at: datetime | None = None
) -> RescueResult:
    """Recover running rows whose lease expired or whose worker is dead.

    The outcome of such a row is uncertain (the step may or may not have
    happened). Rows the part says to hold (``part.rescue_holds()``: a "hold"
    destination, attempts used up) go to the failed state marked as such;
    the rest become ready at once. Clearing the lease token fences the old
    holder out: whatever it records later changes nothing.
    """
    life = part.lifecycle
    if life.running is None:  # lock mode: a crash rolls the claim back, nothing is stuck
        if not dead_workers:
            mark_swept(part)
        return RescueResult()
    now = clock.now(at)
    lost = Q(locked_until__lt=now)
    if dead_workers:
        lost |= Q(claimed_by__in=list(dead_workers))
    stuck = part.model._default_manager.using(part.using).filter(lost, state=life.running)
    cause = "its worker stopped" if dead_workers else "its lease expired"
    note = f"{cause} while {life.running}: outcome uncertain"
    cleared = {"locked_until": None, "lock_token": None, "claimed_by": None}
    with transaction.atomic(using=part.using):
        held = stuck.filter(part.rescue_holds()).update(
            state=life.failed,
            **part.held_values(),
            **cleared,
            last_error=f"{note}; held for an operator",
        )
        resent = stuck.update(
            state=life.ready, available_at=now, **cleared, last_error=f"{note}; running again"
        )
    result = RescueResult(resent=resent, held=held)
    if not dead_workers:
        mark_swept(part)
    if result.total:
        part.logger.warning(
            "rescued %d %s row(s) (%s): %d ready again, %d held",
            result.total,
            part.name,
            cause,
            resent,
            held,
        )
        part.on_rescued(result)
    return result


def purge_finished(
    part: Part,
    *,
    older_than: timedelta | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    at: datetime | None = None,
) -> int:
    """Delete finished rows of *part* older than *older_than* (``RETENTION_DAYS``)."""
    config = part.config
    age = older_than if older_than is not None else timedelta(days=config.retention_days)
    before = clock.later(clock.now(at), -age.total_seconds())
    rows = part.model._default_manager.using(part.using).filter(
        state__in=part.lifecycle.finished, finished_at__lt=before
    )
    deleted = purge_in_batches(
        rows, batch_size=batch_size or config.purge_batch_size, max_batches=max_batches
    )
    if deleted:
        part.logger.info("purged %d finished %s row(s)", deleted, part.name)
    return deleted


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
        return (
            f"{self.part} has unfinished rows and {since}: rows whose trigger was lost or whose "
            "lease expired are not being recovered. Is Celery beat running the documented "
            "schedule (or an outbox_relay / outbox_sweep)?"
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
        life = part_class.lifecycle
        rows = part_class.model._default_manager.using(using)
        waiting = [state for state in (life.ready, life.running) if state is not None]
        if rows.filter(state__in=waiting).exists():
            stale.append(StaleSweep(part=name, last_run_at=last, silent_for=silent_for))
    return stale
