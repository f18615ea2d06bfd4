"""The state changes of every part, written once and keyed by its ``Lifecycle``.

An outcome (``engine.outcomes``) becomes one named transition, the names
django-tasks-db and River use:

- ``mark_done``: the step succeeded; the row is finished (``done``).
- ``retry_later``: it failed and may succeed later: ``ready`` again after a
  backoff with jitter.
- ``dead_letter``: it failed for good, or its attempts are used up: ``failed``,
  for an operator.
- ``hold``: its outcome is uncertain and the part holds such rows: ``failed``,
  marked as held (the outbox's ``uncertain``).
- ``skip``: deliberately not done: ``skipped`` (lock-mode parts).
- ``defer``: not yet: ``ready`` again later, the attempt not counted.
- ``release``: given back before it started (or started but handed back): ``ready``
  at once, the attempt not counted.

Whoever records an outcome (a runner after its step, the rescue of a dead
worker's rows, a lock-mode batch) asks :func:`decide` for the change and
writes it with :func:`apply`: a rescue cannot forget what a normal failure
does (the job's own attempt limit, its error entry, parking its serial key).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import models, transaction
from django.db.models import F, Value

from django_outbox.engine import clock
from django_outbox.engine.backoff import backoff_delay
from django_outbox.engine.lease import comparable
from django_outbox.engine.outcomes import Defer, Done, Fail, Outcome, Retry, Skip, Uncertain
from django_outbox.validation import storable

if TYPE_CHECKING:
    from django_outbox.engine.part import Part

#: Characters of an error kept in ``last_error``.
ERROR_CHARS = 4000


def error_text(reason: str) -> str:
    """*reason* as ``last_error`` keeps it: what a database refuses escaped (an exception's
    text may hold a NUL, which PostgreSQL refuses in any text: the outcome would never be
    recorded and the row would stay claimed), at most ``ERROR_CHARS`` characters."""
    return storable(reason)[:ERROR_CHARS]


#: What every transition out of a lease clears (who holds the row, until when).
LEASE_CLEARED: dict[str, Any] = {"locked_until": None, "lock_token": None, "claimed_by": None}


class Transition(enum.Enum):
    """The named ways a row leaves a step (see the module's docstring)."""

    MARK_DONE = "mark_done"
    RETRY_LATER = "retry_later"
    DEAD_LETTER = "dead_letter"
    HOLD = "hold"
    SKIP = "skip"
    DEFER = "defer"
    RELEASE = "release"

    # A member is equal only to itself, so the identity hash agrees with equality; it
    # is computed in C, where ``Enum``'s own hashes the member's name in Python: every
    # recorded row looks its transition up in a dict or a set at least once.
    __hash__ = object.__hash__


#: Transitions that record a failed attempt (signals, logs, metrics).
FAILED = frozenset({Transition.RETRY_LATER, Transition.DEAD_LETTER, Transition.HOLD})
#: Transitions after which a keyed row holds its key back until an operator acts.
PARKS_KEY = frozenset({Transition.RETRY_LATER, Transition.DEAD_LETTER, Transition.HOLD})


@dataclass(slots=True)
class Change:
    """One row's transition: the fields to write and the error text recorded."""

    row: Any
    transition: Transition
    values: dict[str, Any]
    error: str = ""
    #: A finished row's values shared with others of its group, and its own on top
    #: (``values`` is both): rows with equal own values share one UPDATE.
    shared: dict[str, Any] | None = None
    own: Mapping[str, Any] | None = None

    @property
    def failed(self) -> bool:
        # ``is``, not ``in FAILED``: an Enum member's hash is computed in Python.
        transition = self.transition
        return (
            transition is Transition.RETRY_LATER
            or transition is Transition.DEAD_LETTER
            or transition is Transition.HOLD
        )

    @property
    def will_retry(self) -> bool:
        return self.transition is Transition.RETRY_LATER


@dataclass
class Applied:
    """What :func:`apply` wrote: changes per transition, and the rows whose change was
    not written because the row was no longer held (fenced out)."""

    written: list[Change] = field(default_factory=list)
    fenced: int = 0

    def count(self, *transitions: Transition) -> int:
        return sum(1 for change in self.written if change.transition in transitions)


class Decisions:
    """Turns outcomes into changes for one group of rows recorded at *now*.

    Rows that finished with nothing of their own and started together share one dict
    of values (and so one UPDATE)."""

    def __init__(
        self,
        part: Part,
        now: clock.Instant,
        *,
        count_attempt: bool = False,
        write_attempts: bool = False,
    ) -> None:
        self.part = part
        self.now = now
        #: Lease mode: the attempt is counted with its outcome (``attempts + 1``, and when
        #: it started); lock mode counted it when it claimed the batch.
        self.count_attempt = count_attempt
        #: Rows whose attempt was counted in Python only (``run_owned``): each writes its
        #: own ``attempts``, and rows share the values of a finish only with equal counts.
        self.write_attempts = write_attempts
        self._done: dict[Any, dict[str, Any]] = {}

    def done_values(self, row: Any = None) -> dict[str, Any]:
        """The fields of a row that finished, shared by the rows of the group that
        started together (one dict, one UPDATE)."""
        started = self._started(row)
        attempts = row.attempts if self.write_attempts and row is not None else None
        values = self._done.get((started, attempts))
        if values is None:
            part = self.part
            values = {
                "state": part.lifecycle.done,
                "locked_until": None,
                "attempt_open": False,
                "unclean_end": False,
                **part.done_values(self.now),
            }
            if part.ordering is not None:
                values.update(blocking=False, blocked=False)
            values.update(self._counted(started))
            if attempts is not None:
                values["attempts"] = attempts
            self._done[started, attempts] = values
        return values

    def _started(self, row: Any) -> Any:
        if not self.count_attempt or row is None:
            return None
        return getattr(row, self.part.attempted_at_field, None)

    def _counted(self, started: Any) -> dict[str, Any]:
        """Lease mode: the attempt counted, and when it started."""
        if not self.count_attempt:
            return {}
        counted: dict[str, Any] = {"attempts": F("attempts") + 1}
        if started is not None:
            counted[self.part.attempted_at_field] = started
        return counted

    def decide(self, row: Any, outcome: Outcome) -> Change:
        """The transition *outcome* means for *row* (whose ``attempts`` counts the
        attempt that produced it), with every field the part writes for it."""
        part, now = self.part, self.now
        life = part.lifecycle
        if isinstance(outcome, Done):
            own = part.done_row_values(row, outcome)
            shared = self.done_values(row)
            if not own:
                return Change(row, Transition.MARK_DONE, shared, shared=shared)
            return Change(row, Transition.MARK_DONE, {**shared, **own}, shared=shared, own=own)
        closed = {"attempt_open": False, "unclean_end": False}
        if isinstance(outcome, Defer):
            values = {
                "state": life.ready,
                "last_error": error_text(outcome.reason),
                **LEASE_CLEARED,
                **closed,
            }
            if outcome.seconds is not None:
                values["available_at"] = clock.later(now, outcome.seconds)
            if getattr(row, "attempt_open", False):
                values["attempts"] = max(int(row.attempts) - 1, 0)
            return Change(row, Transition.DEFER, values)
        if isinstance(outcome, Skip):
            if life.skipped is None:
                raise TypeError(f"{part.name} has no skipped state for {outcome!r}")
            values = {
                "state": life.skipped,
                "last_error": error_text(outcome.reason),
                **LEASE_CLEARED,
                **closed,
                **part.done_values(now),
            }
            return Change(row, Transition.SKIP, values)
        if not isinstance(outcome, (Retry, Fail, Uncertain)):
            raise TypeError(f"{part.name} gave the outcome {outcome!r}: not an engine outcome")
        change = _failure(part, row, outcome, now, closed)
        change.values.update(self._counted(self._started(row)))
        return change


def decide(part: Part, row: Any, outcome: Outcome, now: clock.Instant) -> Change:
    """The change *outcome* means for one *row* (see ``Decisions.decide``)."""
    return Decisions(part, now).decide(row, outcome)


def _failure(
    part: Part,
    row: Any,
    outcome: Retry | Fail | Uncertain,
    now: clock.Instant,
    closed: dict[str, Any],
) -> Change:
    life = part.lifecycle
    text = storable(outcome.error or "failed")
    base = {**LEASE_CLEARED, **closed, **part.failed_values(row, outcome)}
    if isinstance(outcome, Uncertain) and part.holds_uncertain(row):
        text = f"outcome uncertain, held for an operator: {text}"
        values = {"state": life.failed, **base, **part.held_values(row, now)}
        return _keyed(part, row, Change(row, Transition.HOLD, values, text[:ERROR_CHARS]))
    attempts = int(row.attempts)
    if isinstance(outcome, Fail) or attempts >= part.max_attempts(row):
        if not isinstance(outcome, Fail):
            counted = "1 attempt" if attempts == 1 else f"{attempts} attempts"
            text = f"gave up after {counted}: {text}"
        values = {"state": life.failed, **base, **part.dead_values(row, now)}
        if isinstance(outcome, Uncertain):
            # Its last attempt may have happened: the operator must know (outbox's mark).
            values.update(part.held_values(row, now))
        return _keyed(part, row, Change(row, Transition.DEAD_LETTER, values, text[:ERROR_CHARS]))
    delay = outcome.delay
    if delay is None:
        low, high = part.retry_delays(row)
        delay = backoff_delay(max(attempts, 1), base=low, maximum=high, rng=part.rng)
    values = {"state": life.ready, "available_at": clock.later(now, delay), **base}
    return _keyed(part, row, Change(row, Transition.RETRY_LATER, values, text[:ERROR_CHARS]))


def _keyed(part: Part, row: Any, change: Change) -> Change:
    """Record the error; a keyed row that failed holds its key back (its followers are
    parked until it finishes)."""
    ordering = part.ordering
    if ordering is not None and getattr(row, ordering.key_fields[-1], None) is not None:
        change.values["blocking"] = True
    change.values["last_error"] = change.error
    return change


def release(part: Part, row: Any) -> Change:
    """Give *row* back before its attempt (or with its attempt uncounted)."""
    values: dict[str, Any] = {"state": part.lifecycle.ready, **LEASE_CLEARED}
    values["attempt_open"] = False
    return Change(row, Transition.RELEASE, values)


def release_values(part: Part) -> dict[str, Any]:
    """The UPDATE of a release by query (rows not loaded): back to ready, uncounted (a
    lease-mode attempt counts only with its outcome or its rescue)."""
    return {"state": part.lifecycle.ready, **LEASE_CLEARED, "attempt_open": False}


def apply(part: Part, held: Any, changes: Sequence[Change]) -> Applied:
    """Write *changes* to the rows of *held* (the rows the writer still holds: a lease
    token, a state; a queryset, or ``lease.FencedRows``); park the keys of keyed rows
    that failed and free those of rows that finished. Run it inside a transaction when it
    writes more than one statement."""
    from django_outbox.engine import ordering
    from django_outbox.engine.lease import FencedRows, update_each, with_ids

    applied = Applied()
    if not changes:
        return applied
    fence = held if isinstance(held, FencedRows) else None
    made: list[models.QuerySet[Any]] = []

    def rows_held() -> models.QuerySet[Any]:
        # Built when a statement needs the ORM: the common record never does.
        if fence is None:
            return held  # type: ignore[no-any-return]
        if not made:
            made.append(fence.queryset())
        return made[0]

    parking: list[Any] = []
    freeing: list[Any] = []
    if part.ordering is not None:
        mark_done = Transition.MARK_DONE
        for c in changes:
            if c.values.get("blocking") is True:
                parking.append(c.row)
            if c.transition is mark_done and getattr(c.row, "blocking", False):
                freeing.append(c.row)
        if parking or freeing:
            # Only the rows still held park or free their keys: a writer fenced out
            # (its lease taken over, the row finished by another) changes nothing,
            # its keys included. Locked until the writes, so no rescue comes between.
            ids = [row.pk for row in (*parking, *freeing)]
            rows = with_ids(rows_held(), ids)
            if transaction.get_connection(held.db).in_atomic_block:
                rows = rows.select_for_update()
            still = set(rows.values_list("pk", flat=True))
            parking = [row for row in parking if row.pk in still]
            freeing = [row for row in freeing if row.pk in still]
    # Rows that share one dict of values (finished with nothing of their own) go in one
    # UPDATE; the rest are grouped by equal values, or written with CASE.
    shared: dict[Any, tuple[dict[str, Any], list[Any]]] = {}
    each: dict[Any, dict[str, Any]] = {}
    for change in changes:
        if change.shared is not None:
            key: Any = id(change.shared)
            if change.own:
                try:
                    key = (key, own_signature(change.own))
                except TypeError:  # an expression of its own: a statement of its own
                    each[change.row.pk] = change.values
                    continue
            group = shared.get(key)
            if group is None:
                group = shared[key] = (change.values, [])
            group[1].append(change.row.pk)
        else:
            each[change.row.pk] = change.values
    written = 0
    for values, ids in shared.values():
        if fence is not None:
            written += fence.update(ids, values)  # compiled once on PostgreSQL
        elif len(ids) == 1:
            each[ids[0]] = values
        else:
            written += with_ids(rows_held(), ids).update(**values)
    if each:
        written += update_each(rows_held(), each)
    # Freed first: a batch that finishes one failed head of a key and fails a later
    # one parks the key again behind the later one (the other way round, the freeing
    # would release what the parking had just parked).
    if freeing:
        ordering.unblock(part, freeing)
    if parking:
        ordering.block(part, parking)
    applied.fenced = len(changes) - written
    applied.written = list(changes)
    return applied


def own_signature(own: Mapping[str, Any]) -> Any:
    """What decides whether two rows' own values are equal (``engine.lease``'s rule:
    values with their types, JSON by its canonical text); raises ``TypeError`` for an
    expression. Taken in the dict's order: a part makes its rows' own values in one
    order, and two orders would only make two UPDATEs, never a wrong one."""
    parts: list[tuple[Any, ...]] = []
    for name, value in own.items():
        kind = type(value)
        if kind is list or kind is dict:
            parts.append((name, comparable(value)))
        else:
            parts.append((name, kind, value))  # ``comparable``'s rule, without the call
    signature = tuple(parts)
    hash(signature)
    return signature


def bring_up_to_date(changes: Iterable[Change]) -> None:
    """Set on each change's row the values written (those known in Python: a database
    expression, ``now()`` or ``attempts + 1``, is left as the row had it), so hooks and
    signals see the rows as recorded.

    The values a group's rows share are sorted out once per group, not once per row:
    those that plain attributes hold go into the row's ``__dict__`` in one update (as
    ``setattr`` would put them there), the others through ``setattr``."""
    prepared: dict[int, tuple[dict[str, Any], list[tuple[str, Any]]]] = {}
    for change in changes:
        row = change.row
        shared = change.shared
        if shared is not None:
            known = prepared.get(id(shared))
            if known is None:
                known = prepared[id(shared)] = _known_values(type(row), shared)
            plain, others = known
            row.__dict__.update(plain)
            for name, value in others:
                setattr(row, name, value)
            values: Mapping[str, Any] = change.own or {}
        else:
            values = change.values
        for name, value in values.items():
            if isinstance(value, Value):
                value = value.value
            elif hasattr(value, "resolve_expression"):
                continue
            setattr(row, name, value)


def _known_values(
    model: type, values: Mapping[str, Any]
) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """*values* known in Python (``Value`` unwrapped, expressions left out), split into
    those a plain attribute holds (no descriptor of the class takes the assignment) and
    the others."""
    plain: dict[str, Any] = {}
    others: list[tuple[str, Any]] = []
    for name, value in values.items():
        if isinstance(value, Value):
            value = value.value
        elif hasattr(value, "resolve_expression"):
            continue
        if hasattr(getattr(model, name, None), "__set__"):
            others.append((name, value))  # a relation, a property: its setter decides
        else:
            plain[name] = value
    return plain, others


def rows_of(changes: Iterable[Change], *transitions: Transition) -> list[Any]:
    """The rows of *changes* that took one of *transitions*."""
    return [c.row for c in changes if c.transition in transitions]


__all__ = [
    "ERROR_CHARS",
    "LEASE_CLEARED",
    "Applied",
    "Change",
    "Decisions",
    "Transition",
    "apply",
    "decide",
    "release",
    "release_values",
    "rows_of",
]
