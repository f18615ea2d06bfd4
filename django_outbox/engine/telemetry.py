"""What the engine counts as it records outcomes: per-minute figures and metrics.

Every place that records outcomes (a lease runner's group, a lock-mode batch
after its commit, the rescue of a dead worker's rows) calls :func:`recorded`
once for the whole group, after the write. It does two cheap things:

- adds the group's counts to an in-memory tally per ``(part, minute, event)``,
  which :func:`flush` adds to the ``MinuteCount`` table in one statement: the
  heartbeat thread flushes every beat, a process without a heartbeat at most every
  ``FLUSH_SECONDS`` after a group (never inside a transaction), and rows older
  than ``KEEP_MINUTES`` are deleted by the flush. The health page draws its chart
  from that table: no query over the parts' tables, one small write per process
  and beat whatever the throughput;
- hands the same counts to the Prometheus metrics when the ``prometheus`` extra
  is installed and ``METRICS`` is on (``django_outbox.metrics``), per
  destination, source or queue.

Events (the ``event`` column and the metrics' names) are the engine's, one per
way a row leaves a step: ``done``, ``retried`` (failed, due again), ``dead``
(dead-lettered: ``send_error``, ``handle_error``, ``FAILED``), ``held`` (the
outbox's uncertain rows held for an operator), ``skipped`` and ``rescued``
(taken back from a dead worker or an expired lease).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from django_outbox.engine.transitions import Change, Transition

if TYPE_CHECKING:
    from django_outbox.engine.part import Part

logger = logging.getLogger("django_outbox.telemetry")

#: Every event counted, in the order the health page lists them.
EVENTS = ("done", "retried", "dead", "held", "skipped", "rescued")
#: Seconds between two flushes of a process without a heartbeat.
FLUSH_SECONDS = 5.0
#: Minutes of counts kept in the table (the page shows the last 60).
KEEP_MINUTES = 120
#: Seconds between two deletions of old counts by one process.
PRUNE_SECONDS = 600.0

_EVENT_OF: Mapping[Transition, str] = {
    Transition.MARK_DONE: "done",
    Transition.RETRY_LATER: "retried",
    Transition.DEAD_LETTER: "dead",
    Transition.HOLD: "held",
    Transition.SKIP: "skipped",
}

_lock = threading.Lock()
#: (part, minute as epoch seconds, event) -> count, not flushed yet.
_tally: dict[tuple[str, int, str], int] = {}
_last_flush = time.monotonic()
_last_prune = 0.0


def minute_of(epoch: float) -> int:
    """The start of *epoch*'s minute, in epoch seconds."""
    return int(epoch // 60) * 60


def count(part: str, event: str, number: int = 1, *, at: float | None = None) -> None:
    """Add *number* rows of *part* that reached *event* to this minute's tally."""
    if number <= 0:
        return
    key = (part, minute_of(time.time() if at is None else at), event)
    with _lock:
        _tally[key] = _tally.get(key, 0) + number


def recorded(part: Part, changes: Sequence[Change]) -> None:
    """Count a group of recorded *changes* of *part* (after they were written)."""
    if not changes:
        return
    events: dict[str, int] = {}
    for change in changes:
        event = _EVENT_OF.get(change.transition)
        if event is not None:
            events[event] = events.get(event, 0) + 1
    if not events:
        return
    minute = minute_of(time.time())
    name = part.name
    with _lock:
        for event, number in events.items():
            key = (name, minute, event)
            _tally[key] = _tally.get(key, 0) + number
    from django_outbox import metrics

    if metrics.enabled():
        metrics.recorded(part, changes)
    _flush_soon(part.using)


def rescued(part: Part, number: int) -> None:
    """Count *number* rows of *part* taken back from dead workers or expired leases."""
    count(part.name, "rescued", number)
    from django_outbox import metrics

    if metrics.enabled():
        metrics.rescued(part.name, number)


def _flush_soon(using: str) -> None:
    """Flush now if this process has no heartbeat to do it and the last flush is old."""
    if time.monotonic() - _last_flush < FLUSH_SECONDS:
        return
    from django_outbox.engine import heartbeat

    current = heartbeat.current()
    if current is not None and current.alive:
        return
    if connections[using].in_atomic_block:
        return  # never inside someone's transaction: counts would roll back with it
    try:
        flush(using)
    except DatabaseError:
        logger.warning("could not write the per-minute counts; kept for the next flush")


def discard() -> None:
    """Forget the counts not flushed yet (tests)."""
    global _tally
    with _lock:
        _tally = {}


def _after_fork() -> None:
    """A forked child (a Celery pool process) starts with none of its parent's counts
    (they are the parent's to flush) and a lock of its own: the parent's may have
    been held by another thread at the fork."""
    global _lock, _tally
    _lock = threading.Lock()
    _tally = {}


os.register_at_fork(after_in_child=_after_fork)


def pending() -> dict[tuple[str, int, str], int]:
    """The counts not flushed yet (a copy)."""
    with _lock:
        return dict(_tally)


def flush(using: str = DEFAULT_DB_ALIAS) -> int:
    """Add the tally to the ``MinuteCount`` table (one statement); return how many
    ``(part, minute, event)`` rows it touched. On a database error the counts are kept
    for the next flush and the error is raised."""
    global _last_flush, _tally
    with _lock:
        taken, _tally = _tally, {}
        _last_flush = time.monotonic()
    if not taken:
        return 0
    try:
        _add(using, taken)
    except DatabaseError:
        with _lock:
            for key, number in taken.items():
                _tally[key] = _tally.get(key, 0) + number
        raise
    _prune_now_and_then(using)
    return len(taken)


def _add(using: str, counts: Mapping[tuple[str, int, str], int]) -> None:
    from django_outbox.engine.models import MinuteCount
    from django_outbox.engine.retry import retry_transient

    connection = connections[using]
    table = connection.ops.quote_name(MinuteCount._meta.db_table)
    # Sorted: concurrent flushes lock the same rows in the same order (no deadlock).
    rows = sorted(counts.items())
    values = ", ".join(["(%s, %s, %s, %s)"] * len(rows))
    params: list[Any] = []
    for (part, minute, event), number in rows:
        moment = datetime.fromtimestamp(minute, tz=UTC)
        params += [part, connection.ops.adapt_datetimefield_value(moment), event, number]
    if connection.vendor == "mysql":
        sql = (
            f"INSERT INTO {table} (part, minute, event, count) VALUES {values} "
            "ON DUPLICATE KEY UPDATE count = count + VALUES(count)"
        )
    else:
        sql = (
            f"INSERT INTO {table} (part, minute, event, count) VALUES {values} "
            f"ON CONFLICT (part, minute, event) DO UPDATE SET count = {table}.count + "
            "EXCLUDED.count"
        )

    def write() -> None:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)

    retry_transient(write, what="writing the per-minute counts")


def _prune_now_and_then(using: str) -> None:
    global _last_prune
    if time.monotonic() - _last_prune < PRUNE_SECONDS:
        return
    _last_prune = time.monotonic()
    from django_outbox.engine.models import MinuteCount

    oldest = datetime.fromtimestamp(minute_of(time.time()) - KEEP_MINUTES * 60, tz=UTC)
    MinuteCount.objects.using(using).filter(minute__lt=oldest).delete()


def per_minute(
    using: str = DEFAULT_DB_ALIAS,
    *,
    minutes: int = 60,
    parts: Iterable[str] | None = None,
    now: float | None = None,
) -> dict[str, dict[str, list[int]]]:
    """The flushed counts of the last *minutes* minutes: ``{part: {event: [count per
    minute, oldest first]}}``, the current minute last (0 where nothing was counted)."""
    from django_outbox.engine.models import MinuteCount

    last = minute_of(time.time() if now is None else now)
    first = last - (minutes - 1) * 60
    rows = MinuteCount.objects.using(using).filter(
        minute__gte=datetime.fromtimestamp(first, tz=UTC)
    )
    if parts is not None:
        rows = rows.filter(part__in=list(parts))
    figures: dict[str, dict[str, list[int]]] = {}
    for part, minute, event, number in rows.values_list("part", "minute", "event", "count"):
        slot = (int(minute.timestamp()) - first) // 60
        if 0 <= slot < minutes:
            series = figures.setdefault(part, {}).setdefault(event, [0] * minutes)
            series[slot] += number
    return figures
