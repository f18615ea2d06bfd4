"""Handling: the inbox's step for the engine, run in lock mode.

Everything about claiming, backoff, dead-lettering and draining is the
engine's (``engine.locked``). What is the inbox's own is here: which
handler a message goes to, a savepoint per message (a failing handler rolls
back its own effects only), the per-key cursor of ordered handling, and the
inbox's signals and log lines.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from typing import Any, TypeVar

from django.db import DatabaseError, IntegrityError, connections, transaction

from django_outbox import metrics, signals, tracing
from django_outbox.engine import clock, triggers
from django_outbox.engine.locked import LockedResult, LockedRunner
from django_outbox.engine.outcomes import (
    DONE,
    Defer,
    Fail,
    Outcome,
    Outcomes,
    Retry,
    Skip,
    Uncertain,
    describe,
)
from django_outbox.engine.part import Attempt, Lifecycle, Part, register
from django_outbox.engine.retry import connection_broken, is_transient
from django_outbox.engine.transitions import Transition
from django_outbox.exceptions import ConfigurationError, RetryableError
from django_outbox.inbox.handlers import Handler, get_handler
from django_outbox.inbox.models import (
    FINISHED_STATES,
    InboxCursor,
    InboxMessage,
    InboxState,
    wake_free,
    wake_held,
)
from django_outbox.validation import storable
from django_outbox.wire import HEADER_REPLY_TO

S = TypeVar("S")

#: The Celery task an on-commit trigger of the inbox sends.
HANDLE_TASK = "django_outbox.tasks.handle_inbox"
#: ``last_error`` of a message whose gap was reported (reported once).
GAP_ALERT = "gap alert: "
#: ``last_error`` of a message of a strict key waiting for its predecessor.
WAITING = "waiting for sequence"


class _HandlerRaised(Exception):
    """A handler raised during the batch's optimistic pass (no savepoints)."""


@register
class Handling(Part):
    """The inbox part: incoming messages handed to their type's handler."""

    name = "inbox"
    sweepers = (
        "Celery beat's django_outbox.sweep_inbox (the documented schedule), or inbox_worker, or "
        "inbox_sweep from cron"
    )
    model = InboxMessage
    lifecycle = Lifecycle(
        ready=InboxState.SHOULD_BE_HANDLED,
        running=None,
        done=InboxState.HANDLED,
        failed=InboxState.HANDLE_ERROR,
        finished=FINISHED_STATES,
        skipped=InboxState.SKIPPED,
    )

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        #: Messages of strict keys made due by handling their predecessor.
        self.woken = 0
        #: Successors to wake once the batch has committed: another transaction held
        #: them when their predecessor was handled (``inbox.models.wake_held``).
        self.unwoken: set[Any] = set()

    def process(self, rows: Sequence[Any], attempt: Attempt) -> Iterator[Outcomes]:
        """Handle *rows*: first all together (one savepoint for the batch); if a handler
        raises, the batch's effects are rolled back and every message is handled again
        in a savepoint of its own, so only the failing ones lose their effects.

        Savepoints cost two round trips per message; a batch where no handler fails
        (the usual case) pays for one. A handler may therefore run twice in a batch
        that had a failure; only its committed run counts (see docs/inbox.md).
        """
        # Messages of one key go in sequence order, so a shuffled delivery that
        # lands in one batch is handled in order without waiting. Without keys, in
        # the order they came.
        ordered = rows
        if any(r.key is not None for r in rows):
            ordered = sorted(
                rows,
                key=lambda r: (r.key is None, r.source, r.key or "", r.sequence or 0, r.pk),
            )
        deadline = attempt.deadline
        woken = self.woken
        try:
            with transaction.atomic(using=self.using):
                outcomes = self._handle_all(ordered, deadline, isolated=False)
        except _HandlerRaised:
            self.woken = woken
            outcomes = self._handle_all(ordered, deadline, isolated=True)
        yield outcomes

    def _handle_all(self, rows: Sequence[Any], deadline: float, *, isolated: bool) -> Outcomes:
        outcomes: Outcomes = {}
        recorded = tracing.recording()  # asked once: a provider is not installed mid-batch
        for row in rows:
            if time.monotonic() >= deadline:
                break
            outcomes[row.pk] = self.handle(row, isolated=isolated, recorded=recorded)
        return outcomes

    def handle(
        self, message: InboxMessage, *, isolated: bool = True, recorded: bool | None = None
    ) -> Outcome:
        """Run *message*'s handler (in a savepoint if *isolated*); return its outcome.

        Not isolated, a handler's exception is raised as ``_HandlerRaised`` for the
        caller to roll back the batch and start again isolated. *recorded* is
        ``tracing.recording()`` asked for the batch.
        """
        handler = get_handler(message.type)
        if handler is None:
            return Fail(
                f"no handler for type {message.type!r}: register one with "
                "@django_outbox.handler, deploy, then requeue this message"
            )
        keyed = handler.ordering is not None and message.key is not None
        timed = metrics.enabled()
        began = time.perf_counter() if timed else 0.0
        try:
            # The handler's span is current while it runs (its exception is recorded).
            with (
                tracing.handling(message, recorded),
                transaction.atomic(using=self.using) if isolated else nullcontext(),
            ):
                if keyed and message.sequence is not None:
                    cursor = self._cursor(message)
                    verdict = self._order(message, handler, cursor)
                    if verdict is not None:
                        return verdict
                    reply = handler.function(message)
                    self._advance(message, cursor)
                else:
                    reply = handler.function(message)
                if reply is not None and message.headers.get(HEADER_REPLY_TO):
                    self._reply(message, reply)
            if timed:
                setattr(message, metrics.STEP_SECONDS, time.perf_counter() - began)
        except Exception as exc:
            if isinstance(exc, DatabaseError) and (
                is_transient(exc) or connection_broken(self.using)
            ):
                # A deadlock (MySQL rolls back the whole transaction, savepoints
                # included) or a lost connection: the runner runs the batch again.
                raise
            if not isolated:
                raise _HandlerRaised from exc
            if timed:
                setattr(message, metrics.STEP_SECONDS, time.perf_counter() - began)
            # Kept as the row's last_error and traceback: what PostgreSQL cannot store
            # (a NUL) is escaped, or recording the failure would fail the whole batch.
            details = {"traceback": storable(_handler_traceback(exc))}
            if isinstance(exc, (RetryableError, *handler.retry_on)):
                return Retry(storable(describe(exc)), details)
            return Fail(storable(describe(exc)), details)
        return DONE

    def _reply(self, message: InboxMessage, reply: Any) -> None:
        """Send the handler's return value back to the requester, in the handler's
        transaction (through the outbox: the documented seam between the parts)."""
        from django_outbox.outbox.api import send

        source = self.settings.inbox.sources.get(message.source)
        destination = source.options.get("reply_to") if source is not None else None
        if not destination:
            raise ConfigurationError(
                f"the handler returned a reply to a request, but source {message.source!r} "
                "has no REPLY_TO destination to send it to"
            )
        send(
            f"{message.type}.reply",
            reply,
            to=str(destination),
            correlation_id=message.correlation_id or message.message_id,
            using=self.using,
        )

    # -- ordering per key --------------------------------------------------------

    def before_batch(self, rows: Sequence[Any]) -> None:
        """Create the cursors of the batch's ordered keys, committed before its
        transaction: a cursor created inside it would hold a unique-index lock that a
        second worker's batch waits on while waiting on something of the first's."""
        ensure_cursors(self.using, rows)

    def _cursor(self, message: InboxMessage) -> InboxCursor:
        """The key's cursor, locked until the batch commits: another worker's batch with
        a message of the key waits for it. Messages are handled in (source, key) order,
        so two batches always take their cursors in the same order and cannot deadlock
        on them. Created here only when ``before_batch`` was not called."""
        assert message.key is not None
        cursors = InboxCursor.objects.using(self.using)
        cursor = cursors.select_for_update().filter(source=message.source, key=message.key).first()
        if cursor is not None:
            return cursor
        try:
            with transaction.atomic(using=self.using):
                return cursors.create(source=message.source, key=message.key, last_sequence=0)
        except IntegrityError:
            # Another worker created it first: wait for its lock, then use it.
            return cursors.select_for_update().get(source=message.source, key=message.key)

    def _order(
        self, message: InboxMessage, handler: Handler, cursor: InboxCursor
    ) -> Outcome | None:
        """``None`` to handle *message* now, or why not (skip it, or wait)."""
        sequence = message.sequence
        assert sequence is not None
        last = cursor.last_sequence
        if sequence <= last:
            return Skip(
                f"sequence {sequence} of key {message.key!r} is not newer than {last}, "
                f"already handled ({handler.ordering} ordering)"
            )
        if handler.ordering == "latest" or sequence == last + 1:
            return None
        reason = f"{WAITING} {last + 1} of key {message.key!r} (this is {sequence})"
        # It sleeps until the alert is due: handling its predecessor wakes it
        # at once, so a gap costs no claims while it lasts.
        alert_after = self.settings.inbox.gap_alert_seconds
        if message.last_error.startswith(GAP_ALERT):
            return Defer(alert_after, GAP_ALERT + reason)
        waited = InboxMessage.objects.using(self.using).filter(
            pk=message.pk, created_at__lte=clock.later(clock.now(), -alert_after)
        )
        if not waited.exists():
            return Defer(alert_after, reason)
        self.logger.warning(
            "inbox gap: message %s (%s from %s) has waited over %g s for sequence %d of "
            "key %r; release it in the admin if that message will never come",
            message.message_id,
            message.type,
            message.source,
            alert_after,
            last + 1,
            message.key,
        )
        signals.emit(signals.inbox_gap_detected, sender=Handling, message=message, missing=last + 1)
        return Defer(alert_after, GAP_ALERT + reason)

    def _advance(self, message: InboxMessage, cursor: InboxCursor) -> None:
        """Move the key's cursor to *message*, and wake its successor if it waits.

        The successor is woken only if no other batch holds it (``SKIP LOCKED``): that
        batch handles it itself once it has the cursor, and this batch never waits on
        another's rows while holding a cursor (no deadlock)."""
        sequence = message.sequence
        assert sequence is not None
        now = clock.now()
        messages = InboxMessage.objects.using(self.using)
        handler = get_handler(message.type)
        if handler is not None and handler.ordering == "strict":
            # Messages an operator skipped ahead of the cursor count as passed once the
            # cursor reaches them: their successor must not wait for a gap alert.
            ahead = messages.filter(
                source=message.source,
                key=message.key,
                sequence__gt=sequence,
                state=InboxState.SKIPPED,
            ).order_by("sequence")
            for skipped in ahead.values_list("sequence", flat=True)[:1000]:
                if skipped != sequence + 1:
                    break
                sequence = skipped
        InboxCursor.objects.using(self.using).filter(pk=cursor.pk).update(
            last_sequence=sequence, updated_at=now
        )
        cursor.last_sequence = sequence
        # Found first, then locked by primary key: on InnoDB a locking read through
        # the key's index does not skip a row another transaction locked by its
        # primary key (a claim), and a row that is found but held is woken later.
        found = list(
            messages.filter(
                source=message.source,
                key=message.key,
                sequence=sequence + 1,
                state=InboxState.SHOULD_BE_HANDLED,
            ).values_list("pk", flat=True)
        )
        if found:
            self._wake(found)

    def _wake(self, pks: Sequence[Any]) -> None:
        """Wake the waiting messages *pks* no other transaction holds; the held ones are
        woken once this batch has committed (``on_recorded``)."""
        woken, held = wake_free(self.using, list(pks))
        self.woken += woken
        self.unwoken.update(held)

    def on_recorded(self, changes: Sequence[Any]) -> None:
        """Wake messages of strict keys this batch deferred for a gap whose predecessor
        committed meanwhile.

        Their predecessor's batch wakes them when it commits, if it can see them; but
        a message this batch inserted (``inbox_consume``) was invisible to it until
        now. Reading the cursors under their lock waits for a batch still handling
        the key, so one of the two always sees the other: no wake-up is lost."""
        waiting = [
            c.row
            for c in changes
            if c.transition is Transition.DEFER
            and str(c.values.get("last_error", "")).startswith(WAITING)
        ]
        if waiting:
            self._wake_ready(waiting)
        if self.unwoken:
            # Successors another transaction held when their predecessor was handled:
            # woken now that this batch holds nothing, waiting for their holder.
            held, self.unwoken = sorted(self.unwoken), set()
            self.woken += wake_held(self.using, held)

    def _wake_ready(self, waiting: Sequence[Any]) -> None:
        keys = sorted({(row.source, row.key) for row in waiting})
        cursors = InboxCursor.objects.using(self.using).select_for_update()
        with transaction.atomic(using=self.using):
            # One key at a time, through the (source, key) index, in the order every
            # batch takes them: one statement for all of them may scan the table in
            # primary-key order on InnoDB, locking in another order (a deadlock).
            last = {}
            for source, key in keys:
                for held in cursors.filter(source=source, key=key).values_list(
                    "last_sequence", flat=True
                ):
                    last[source, key] = held
            ready = [
                row.pk for row in waiting if row.sequence == last.get((row.source, row.key), 0) + 1
            ]
            if ready:
                # Never wait for a message while holding the cursors: a held one is
                # being claimed (its batch then waits for these cursors and sees them
                # moved) or woken, or is woken once this transaction has committed.
                self._wake(ready)

    # -- recording ---------------------------------------------------------------

    def done_values(self, now: clock.Instant | None) -> Mapping[str, Any]:
        return {"finished_at": now, "traceback": ""}

    def failed_values(self, row: Any, outcome: Retry | Fail | Uncertain) -> Mapping[str, Any]:
        return {"traceback": str((outcome.details or {}).get("traceback", ""))}

    def on_done(self, rows: Sequence[Any]) -> None:
        self.logger.info(
            "handled %d inbox message(s)", len(rows), extra={"part": self.name, "count": len(rows)}
        )
        if self.logger.isEnabledFor(logging.DEBUG):  # asked once, not once a row
            for row in rows:
                self.logger.debug("handled %s (%s from %s)", row.message_id, row.type, row.source)
        signals.emit(signals.inbox_messages_handled, sender=Handling, messages=list(rows))

    def log_fields(self, row: Any) -> dict[str, Any]:
        fields = super().log_fields(row)
        fields.update(id=row.message_id, type=row.type, source=row.source, key=row.key)
        return fields

    def on_failed(self, row: Any, error: str, will_retry: bool) -> None:
        outcome = "will retry" if will_retry else "moved to handle_error"
        self.log_failure(
            row,
            "inbox message %s (%s from %s) attempt %d failed, %s: %s",
            will_retry,
            row.message_id,
            row.type,
            row.source,
            row.attempts,
            outcome,
            error,
        )
        signals.emit(
            signals.inbox_message_failed,
            sender=Handling,
            message=row,
            error=error,
            will_retry=will_retry,
        )


triggers.register_task(Handling.name, HANDLE_TASK)


class Inbox(LockedRunner):
    """Handles due inbox messages: ``Inbox().drain()``, ``Inbox().deliver(ids)``."""

    def __init__(self, *, using: str | None = None, **options: Any) -> None:
        from django.db import DEFAULT_DB_ALIAS

        super().__init__(Handling(using=using or DEFAULT_DB_ALIAS, **options))

    def drain(
        self, *, time_budget: float | None = None, max_batches: int | None = None
    ) -> LockedResult:
        """The engine's drain, again while handled messages woke the next of their key."""
        part = self.part
        assert isinstance(part, Handling)
        part.woken = 0
        total = super().drain(time_budget=time_budget, max_batches=max_batches)
        while part.woken and max_batches is None:
            part.woken = 0
            total += super().drain(time_budget=time_budget)
        assert isinstance(total, LockedResult)
        return total


def store_and_handle(
    using: str,
    envelopes: Iterable[tuple[str, str, str | None]],
    store: Callable[[], S],
    rows: Callable[[S], Sequence[Any]],
) -> tuple[S, int, bool]:
    """Store messages with *store* (called inside a transaction; *rows* picks the new rows
    out of what it returns) and handle the new ones in that same transaction: they are the
    transaction's own until it commits, so they need no claim, and a crash rolls back the
    rows with their handlers' effects. *envelopes* (``intake.ordered_envelopes``) name the
    ordered keys whose cursors are created first, committed, on MySQL/MariaDB (see
    ``ensure_cursors_of``).

    Returns what *store* returned, how many were handled, and whether handling made other
    messages of strict keys due (stored earlier, waiting for a predecessor among these):
    the caller wakes the handlers for those."""
    if connections[using].vendor == "mysql":
        ensure_cursors_of(using, envelopes)
    inbox = Inbox(using=using)
    with transaction.atomic(using=using):
        stored = store()
        new = rows(stored)
        handled = inbox.run_owned(new).done if new else 0
    part = inbox.part
    assert isinstance(part, Handling)
    return stored, handled, bool(part.woken)


def ensure_cursors(using: str, rows: Iterable[Any]) -> int:
    """Create the missing cursors of the ordered keys among *rows* (messages, or anything
    with ``type``, ``source`` and ``key``); returns how many keys were seen."""
    return ensure_cursors_of(using, ((row.source, row.type, row.key) for row in rows))


def ensure_cursors_of(using: str, envelopes: Iterable[tuple[str, str, str | None]]) -> int:
    """Create the missing cursors of the ordered keys among *envelopes* (``source``,
    ``type``, ``key``); returns how many keys were seen.

    In (source, key) order, the order every batch locks cursors in: inside a
    transaction (``inbox_consume``) the new rows' index locks never form a cycle. On
    MySQL/MariaDB only the missing ones are inserted: ``INSERT IGNORE`` of a key that
    exists leaves a shared lock on it until the transaction ends, and two batches that
    each hold one and then lock the cursor for update deadlock (``inbox_consume``
    creates them committed, before its batch's transaction, for that reason)."""
    keys = set()
    for source, type_, key in envelopes:
        if key is None:
            continue
        handler = get_handler(type_)
        if handler is not None and handler.ordering is not None:
            keys.add((source, key))
    if not keys:
        return 0
    cursors = InboxCursor.objects.using(using)
    missing = sorted(keys)
    if connections[using].vendor == "mysql":
        existing = set(
            cursors.filter(source__in={s for s, _ in keys}, key__in={k for _, k in keys})
            .values_list("source", "key")
            .order_by()
        )
        missing = [pair for pair in missing if pair not in existing]
    if missing:
        cursors.bulk_create(
            [InboxCursor(source=source, key=key, last_sequence=0) for source, key in missing],
            ignore_conflicts=True,
        )
    return len(keys)


def _handler_traceback(exc: BaseException) -> str:
    """The handler's exception with its own traceback and causes (no frame of ours)."""
    return "".join(traceback.format_exception(exc))


__all__ = ["Handling", "Inbox", "LockedResult", "ensure_cursors", "ensure_cursors_of"]
