"""What an operator does to a part's rows: requeue (retry), cancel, skip; written once.

A row that failed for good waits for a person (``Lifecycle.failed``), and a row
not started yet may be given up on. The three parts let an operator do the same
few things in their own words: the outbox requeues and cancels, the inbox
requeues and skips, jobs are retried, cancelled and skipped. Each action is
written here once, keyed by the part's ``Lifecycle``; what is a part's own is
data declared next to its model (:class:`Operations`) and a hook or two:

- **requeue** (jobs say *retry*): ``failed`` → ``ready``, due now, ``attempts``
  reset to 0, the lease and the marks of the last attempt (``attempt_open``,
  ``unclean_end``) cleared, plus the part's ``Part.requeue_values()`` (the
  outbox's ``uncertain``; a job's ``finished_at``, resolution and stop request).
  ``last_error`` is kept for the record. A keyed row keeps its followers parked
  until it finishes. A job whose unique key another active job holds stays
  FAILED (``Operations.choose``).
- **cancel**: rows not started (``Operations.cancel_from``) end without being
  done: the outbox's ``cancelled``; a job ends FAILED, resolution ``cancelled``.
  A running row cannot be cancelled, its step may be doing it right now; a part
  that can ask a running row to stop says so (``Operations.stop_field``: a job's
  ``cancel_requested``, and the job decides).
- **skip**: give up on a row for good (``Operations.skip_from``): it moves to the
  part's ``Lifecycle.skipped`` (the inbox), or keeps its state where the part has
  none (a job stays FAILED, resolution ``skipped``). A skipped message of a strict
  inbox key moves its key's cursor on and wakes its successor
  (``Operations.moved``).

Every action moves only the selected rows that are in its source states (the rest
are left alone and not counted), locked, in one transaction. A cancelled or skipped
row that held its key back releases the key (its parked followers become due). Once
the transaction commits, the part's runners are triggered, so a requeued row runs
now, not at the next sweep.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import models, transaction

from django_outbox.engine import clock, ordering, triggers
from django_outbox.engine.lease import with_ids
from django_outbox.engine.part import Part, registered
from django_outbox.engine.transitions import LEASE_CLEARED

logger = logging.getLogger("django_outbox.operator")

#: Rows read, locked and moved per statement: a bounded statement whatever the selection.
CHUNK = 1000


class Verb(enum.Enum):
    """An operator's action (a part may call one by another name: jobs *retry*)."""

    #: ``failed`` → ``ready``, attempts reset.
    REQUEUE = "requeue"
    #: Not started → ended without being done.
    CANCEL = "cancel"
    #: Given up on for good.
    SKIP = "skip"

    @property
    def past(self) -> str:
        """The verb's past participle: ``"requeued"``, ``"cancelled"``, ``"skipped"``."""
        return {"requeue": "requeued", "cancel": "cancelled", "skip": "skipped"}[self.value]


@dataclass(frozen=True)
class Operations:
    """How one part's operator actions differ from the engine's (declared next to its
    model with :func:`declare`). Subclasses override the hooks."""

    model: type[models.Model]
    #: The part's word for a requeue (jobs: ``"retry"``).
    requeue_word: str = "requeue"
    #: States a cancel applies to (empty: the part's rows cannot be cancelled).
    cancel_from: tuple[str, ...] = ()
    #: The state a cancel moves rows to.
    cancelled: str | None = None
    #: States a skip applies to (empty: the part's rows cannot be skipped).
    skip_from: tuple[str, ...] = ()
    #: A boolean field a cancel sets on running rows of the selection: the step is asked
    #: to stop (jobs: ``cancel_requested``). ``None``: running rows are left alone.
    stop_field: str | None = None
    #: The field whose value names a row's trigger (``"queue_name"``: ``jobs:<queue>``);
    #: ``None``: one trigger per part.
    trigger_field: str | None = None
    #: Further columns the hooks read from the moved rows.
    columns: tuple[str, ...] = ()

    def values(self, verb: Verb, now: clock.Instant) -> Mapping[str, Any]:
        """Fields of the part's own that *verb* sets on every row it moves."""
        return {}

    def choose(self, verb: Verb, rows: list[Any], using: str) -> list[Any]:
        """Of *rows* (locked, in a source state, by primary key), those *verb* moves."""
        return rows

    def moved(self, verb: Verb, part: Part, rows: list[Any]) -> int:
        """Called in the action's transaction with the rows *verb* moved; returns how many
        other rows it made due (they are triggered after the commit)."""
        return 0

    def word(self, verb: Verb) -> str:
        """What the part calls *verb* (``"retry"`` for a job's requeue)."""
        return self.requeue_word if verb is Verb.REQUEUE else verb.value

    def past(self, verb: Verb) -> str:
        """The past participle of :meth:`word` (``"retried"``)."""
        if verb is Verb.REQUEUE and self.requeue_word != "requeue":
            word = self.requeue_word
            return word[:-1] + "ied" if word.endswith("y") else word + "ed"
        return verb.past


_declared: dict[type[models.Model], Operations] = {}


def declare(operations: Operations) -> Operations:
    """Make *operations* the operator rules of its model's part."""
    _declared[operations.model] = operations
    return operations


def operations(model: type[models.Model]) -> Operations:
    """The operator rules declared for *model*."""
    try:
        return _declared[model]
    except KeyError:
        raise LookupError(f"no operator actions are declared for {model.__name__}") from None


def part_class(model: type[models.Model]) -> type[Part]:
    """The registered part whose rows are *model*'s: how a model reaches its part's
    lifecycle and hooks without importing the part's runner."""
    for candidate in registered().values():
        if candidate.model is model:
            return candidate
    raise LookupError(
        f"no engine part drives {model.__name__}: is django_outbox in INSTALLED_APPS "
        "(its AppConfig registers the parts)?"
    )


def part_for(model: type[models.Model], using: str) -> Part:
    """An instance of *model*'s part on database *using*."""
    return part_class(model)(using=using)


def sources(model: type[models.Model], verb: Verb) -> tuple[str, ...]:
    """The states *verb* moves *model*'s rows from (empty: the part has no such action)."""
    rules = operations(model)
    if verb is Verb.REQUEUE:
        return (part_class(model).lifecycle.failed,)
    if verb is Verb.CANCEL:
        return rules.cancel_from
    return rules.skip_from


def verbs_from(model: type[models.Model], state: str) -> list[Verb]:
    """The actions an operator may take on a row of *model* in *state*."""
    return [verb for verb in Verb if state in sources(model, verb)]


@dataclass
class Moved:
    """What one operator action did."""

    #: Primary keys of the rows it moved.
    ids: list[Any] = field(default_factory=list)
    #: Running rows asked to stop (a cancel, where the part can ask).
    stopping: list[Any] = field(default_factory=list)
    #: Other rows it made due: followers of a released key, the successor of a skipped
    #: strict message.
    woken: int = 0

    @property
    def count(self) -> int:
        return len(self.ids)


def requeue(rows: models.QuerySet[Any], *, now: datetime | None = None) -> Moved:
    """Requeue (retry) the failed rows among *rows*; trigger them once committed."""
    return act(Verb.REQUEUE, rows, now=now)


def cancel(rows: models.QuerySet[Any], *, now: datetime | None = None) -> Moved:
    """Cancel the rows among *rows* that may be cancelled (and ask running ones to stop,
    where the part can)."""
    return act(Verb.CANCEL, rows, now=now)


def skip(rows: models.QuerySet[Any], *, now: datetime | None = None) -> Moved:
    """Skip the rows among *rows* that may be skipped."""
    return act(Verb.SKIP, rows, now=now)


def act(verb: Verb, rows: models.QuerySet[Any], *, now: datetime | None = None) -> Moved:
    """Apply *verb* to the rows of *rows* in its source states (see the module's
    docstring); *now* pins the clock (default: the database's)."""
    model = rows.model
    rules = operations(model)
    part = part_for(model, rows.db)
    allowed = sources(model, verb)
    if not allowed:
        raise ValueError(f"{model._meta.verbose_name_plural} cannot be {rules.past(verb)}")
    values = _values(verb, part, rules, clock.now(now))
    result = Moved()
    manager = model._default_manager.using(part.using)
    moved: list[Any] = []
    with transaction.atomic(using=part.using):
        for chunk in _locked_chunks(rows.filter(state__in=allowed), part, rules):
            chosen = rules.choose(verb, chunk, part.using)
            if not chosen:
                continue
            ids = [row.pk for row in chosen]
            # The rows are locked: each is still in a source state.
            with_ids(manager.filter(state__in=allowed), ids).update(**values)
            result.ids.extend(ids)
            moved.extend(chosen)
        if verb is Verb.CANCEL and rules.stop_field is not None:
            # After the cancel: a row claimed meanwhile is running by now, and asked.
            result.stopping = _ask_to_stop(rows, part, rules.stop_field)
        if part.ordering is not None and verb is not Verb.REQUEUE:
            heads = [row for row in moved if row.blocking]
            if heads:
                result.woken += ordering.unblock(part, heads)
        result.woken += rules.moved(verb, part, moved)
        _trigger_on_commit(part, rules, moved if verb is Verb.REQUEUE else [], result.woken)
    return result


def _values(verb: Verb, part: Part, rules: Operations, now: clock.Instant) -> dict[str, Any]:
    life = part.lifecycle
    # Whoever held the row holds it no more, and its last attempt is over.
    closed = {**LEASE_CLEARED, "attempt_open": False, "unclean_end": False}
    values: dict[str, Any]
    if verb is Verb.REQUEUE:
        values = {
            "state": life.ready,
            "attempts": 0,
            "available_at": now,
            **closed,
            **part.requeue_values(),
        }
    elif verb is Verb.CANCEL:
        values = {"state": rules.cancelled, "finished_at": now, **closed}
        if part.ordering is not None:
            values.update(blocking=False, blocked=False)
    else:
        values = {}
        if life.skipped is not None:
            values = {"state": life.skipped, "finished_at": now, **closed}
        if part.ordering is not None:
            values["blocking"] = False
    values.update(rules.values(verb, now))
    return values


def _locked_chunks(
    selection: models.QuerySet[Any], part: Part, rules: Operations
) -> Iterator[list[Any]]:
    """The rows of *selection* in primary-key order, ``CHUNK`` at a time, each chunk
    locked until the transaction ends (rows a runner holds are waited for)."""
    meta = selection.model._meta
    columns = {meta.pk.name, "state", *rules.columns}
    if part.ordering is not None:
        columns.update(part.ordering.key_fields, (part.ordering.sequence_field, "blocking"))
    if rules.trigger_field is not None:
        columns.add(rules.trigger_field)
    features = transaction.get_connection(part.using).features
    locked = selection.order_by("pk").select_for_update(
        of=("self",) if features.has_select_for_update_of else ()
    )
    last = None
    while True:
        page = locked if last is None else locked.filter(pk__gt=last)
        chunk = list(page.only(*columns)[:CHUNK])
        if chunk:
            yield chunk
        if len(chunk) < CHUNK:
            return
        last = chunk[-1].pk


def _ask_to_stop(rows: models.QuerySet[Any], part: Part, stop_field: str) -> list[Any]:
    running = part.lifecycle.running
    if running is None:
        return []
    asking = rows.filter(state=running).exclude(**{stop_field: True})
    features = transaction.get_connection(part.using).features
    # A locking read: it sees every claim committed so far, whatever snapshot the
    # transaction holds (InnoDB's repeatable read).
    locked = asking.order_by("pk").select_for_update(
        of=("self",) if features.has_select_for_update_of else ()
    )
    ids = list(locked.values_list("pk", flat=True))
    manager = part.model._default_manager.using(part.using)
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        with_ids(manager.filter(state=running), chunk).update(**{stop_field: True})
    return ids


def _trigger_on_commit(part: Part, rules: Operations, requeued: Sequence[Any], woken: int) -> None:
    """Once the transaction commits, wake the runners of what became due: the triggers of
    the requeued rows (per queue for jobs), or every trigger of the part when other rows
    became due too (their routes are not known here)."""
    if woken:
        transaction.on_commit(lambda: wake(part), using=part.using)
        return
    if not requeued:
        return
    if rules.trigger_field is None:
        channels = {part.name}
    else:
        channels = {f"{part.name}:{getattr(row, rules.trigger_field)}" for row in requeued}

    def send() -> None:
        for channel in sorted(channels):
            triggers.dispatch(channel, part.using, [])

    transaction.on_commit(send, using=part.using)


def wake(part: Part) -> None:
    """Trigger *part*'s runners (``Part.wake``); a failure is logged, never raised: the
    rows are committed, and the sweep runs them."""
    try:
        part.wake()
    except Exception:
        logger.exception("could not wake the %s runners; the sweep will run the rows", part.name)


def wake_on_commit(part: Part) -> None:
    """Trigger *part*'s runners once the current transaction commits (at once outside
    one)."""
    transaction.on_commit(lambda: wake(part), using=part.using)


__all__ = [
    "CHUNK",
    "Moved",
    "Operations",
    "Verb",
    "act",
    "cancel",
    "declare",
    "operations",
    "part_class",
    "part_for",
    "requeue",
    "skip",
    "sources",
    "verbs_from",
    "wake",
    "wake_on_commit",
]
