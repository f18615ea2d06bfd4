"""Handling: the inbox's step for the engine, run in lock mode.

Everything about claiming, backoff, dead-lettering and draining is the
engine's (``engine.locked``). What is the inbox's own is here: which
handler a message goes to, a savepoint per message (a failing handler rolls
back its own effects only), the per-key cursor of ordered handling, and the
inbox's signals and log lines.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction

from django_outbox import signals
from django_outbox.engine import clock, triggers
from django_outbox.engine.locked import LockedResult, LockedRunner
from django_outbox.engine.part import Defer, Lifecycle, Outcome, Outcomes, Part, Skip, register
from django_outbox.engine.retry import is_transient
from django_outbox.exceptions import DeliveryError, PermanentError, RetryableError
from django_outbox.inbox.handlers import Handler, get_handler
from django_outbox.inbox.models import FINISHED_STATES, InboxCursor, InboxMessage, InboxState
from django_outbox.validation import storable
from django_outbox.wire import HEADER_REPLY_TO

#: The Celery task an on-commit trigger of the inbox sends.
HANDLE_TASK = "django_outbox.tasks.handle_inbox"
#: ``last_error`` of a message whose gap was reported (reported once).
GAP_ALERT = "gap alert: "


class _HandlerRaised(Exception):
    """A handler raised during the batch's optimistic pass (no savepoints)."""


class HandlerFailed(DeliveryError):
    """Wraps a handler's exception with its traceback (recorded on the row)."""

    def __init__(self, text: str, tb: str) -> None:
        super().__init__(text)
        self.traceback = tb


class RetryableHandlerError(HandlerFailed, RetryableError):
    """A handler raised an exception listed in ``retry_on`` (or ``RetryableError``)."""


class PermanentHandlerError(HandlerFailed, PermanentError):
    """A handler raised anything else: the message goes to ``handle_error``."""


@register
class Handling(Part):
    """The inbox part: incoming messages handed to their type's handler."""

    name = "inbox"
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

    def process(self, rows: Sequence[Any], deadline: float) -> Iterator[Outcomes]:
        """Handle *rows*: first all together (one savepoint for the batch); if a handler
        raises, the batch's effects are rolled back and every message is handled again
        in a savepoint of its own, so only the failing ones lose their effects.

        Savepoints cost two round trips per message; a batch where no handler fails
        (the usual case) pays for one. A handler may therefore run twice in a batch
        that had a failure; only its committed run counts (see docs/inbox.md).
        """
        # Messages of one key go in sequence order, so a shuffled delivery that
        # lands in one batch is handled in order without waiting.
        ordered = sorted(
            rows,
            key=lambda r: (r.key is None, r.source, r.key or "", r.sequence or 0, r.pk),
        )
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
        for row in rows:
            if time.monotonic() >= deadline:
                break
            outcomes[row.pk] = self.handle(row, isolated=isolated)
        return outcomes

    def handle(self, message: InboxMessage, *, isolated: bool = True) -> Outcome:
        """Run *message*'s handler (in a savepoint if *isolated*); return its outcome.

        Not isolated, a handler's exception is raised as ``_HandlerRaised`` for the
        caller to roll back the batch and start again isolated.
        """
        handler = get_handler(message.type)
        if handler is None:
            return PermanentError(
                f"no handler for type {message.type!r}: register one with "
                "@django_outbox.handler, deploy, then requeue this message"
            )
        keyed = handler.ordering is not None and message.key is not None
        try:
            with transaction.atomic(using=self.using) if isolated else nullcontext():
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
        except Exception as exc:
            if isinstance(exc, DatabaseError) and is_transient(exc):
                # A deadlock (MySQL rolls back the whole transaction, savepoints
                # included): the batch is run again whole by the runner.
                raise
            if not isolated:
                raise _HandlerRaised from exc
            # Kept as the row's last_error and traceback: what PostgreSQL cannot store
            # (a NUL) is escaped, or recording the failure would fail the whole batch.
            text = storable(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            tb = storable(traceback.format_exc())
            if isinstance(exc, (RetryableError, *handler.retry_on)):
                return RetryableHandlerError(text, tb)
            return PermanentHandlerError(text, tb)
        return None

    def _reply(self, message: InboxMessage, reply: Any) -> None:
        """Send the handler's return value back to the requester, in the handler's
        transaction (through the outbox: the documented seam between the parts)."""
        from django_outbox.outbox.api import send

        source = self.settings.inbox.sources.get(message.source)
        destination = source.options.get("reply_to") if source is not None else None
        if not destination:
            raise PermanentError(
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

    def _cursor(self, message: InboxMessage) -> InboxCursor:
        """The key's cursor, locked until the batch commits (created on first use)."""
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

    def _order(self, message: InboxMessage, handler: Handler, cursor: InboxCursor) -> Outcome:
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
        reason = f"waiting for sequence {last + 1} of key {message.key!r} (this is {sequence})"
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
        """Move the key's cursor to *message*, and wake its successor if it waits."""
        sequence = message.sequence
        assert sequence is not None
        now = clock.now()
        InboxCursor.objects.using(self.using).filter(pk=cursor.pk).update(
            last_sequence=sequence, updated_at=now
        )
        cursor.last_sequence = sequence
        self.woken += (
            InboxMessage.objects.using(self.using)
            .filter(
                source=message.source,
                key=message.key,
                sequence=sequence + 1,
                state=InboxState.SHOULD_BE_HANDLED,
            )
            .update(available_at=now)
        )

    # -- recording ---------------------------------------------------------------

    def done_values(self, now: clock.Instant) -> Mapping[str, Any]:
        return {"finished_at": now, "traceback": ""}

    def failed_values(self, row: Any, error: DeliveryError) -> Mapping[str, Any]:
        return {"traceback": getattr(error, "traceback", "")}

    def on_done(self, rows: Sequence[Any]) -> None:
        self.logger.info("handled %d inbox message(s)", len(rows))
        for row in rows:
            self.logger.debug("handled %s (%s from %s)", row.message_id, row.type, row.source)
        signals.emit(signals.inbox_messages_handled, sender=Handling, messages=list(rows))

    def on_failed(self, row: Any, error: str, will_retry: bool) -> None:
        outcome = "will retry" if will_retry else "moved to handle_error"
        self.logger.warning(
            "inbox message %s (%s from %s) attempt %d failed, %s: %s",
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


__all__ = ["Handling", "Inbox", "LockedResult"]
