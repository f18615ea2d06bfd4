"""Incoming messages: the inbox table and the per-key cursors of ordered handling."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, models, transaction
from django.db.models import Q
from django.utils import timezone

from django_outbox.engine import clock, operator
from django_outbox.engine.models import EngineRow

logger = logging.getLogger("django_outbox.inbox")


class InboxState(models.TextChoices):
    """States of an incoming message; the names are public (admin, metrics, docs)."""

    #: Stored, waiting to be handled once ``available_at`` has passed. Entered by
    #: ``receive()``, a retryable failure, a strict key waiting for its gap, or requeue.
    SHOULD_BE_HANDLED = "should_be_handled", "should be handled"
    #: The handler ran and its effects committed with this state. Final.
    HANDLED = "handled", "handled"
    #: The handler failed for good, no handler exists for the type, or the
    #: message could not be read. Waits for an operator (requeue or skip).
    HANDLE_ERROR = "handle_error", "handle error"
    #: Not handled on purpose: older than what its key already handled
    #: (``ordering="latest"``), or skipped by an operator. Final.
    SKIPPED = "skipped", "skipped"


#: States whose rows the purge deletes once past retention (the deduplication window).
FINISHED_STATES = (InboxState.HANDLED, InboxState.SKIPPED)
#: States from which an operator may requeue or skip (``INBOX_OPERATIONS``).
REQUEUEABLE_STATES = (InboxState.HANDLE_ERROR,)
SKIPPABLE_STATES = (InboxState.SHOULD_BE_HANDLED, InboxState.HANDLE_ERROR)


#: Messages of ``strict`` keys deferred behind a missing sequence (the handler records
#: why in ``last_error``): a queryset filter and a partial index's condition.
WAITING_FOR_GAP = Q(state="should_be_handled", key__isnull=False) & (
    Q(last_error__startswith="waiting for sequence") | Q(last_error__startswith="gap alert: ")
)


class InboxMessageQuerySet(models.QuerySet["InboxMessage"]):
    """Selections and operator actions over incoming messages (the actions are the
    engine's, see ``engine.operator``)."""

    def requeue(self, now: datetime | None = None) -> int:
        """Move ``handle_error`` messages back to ``should_be_handled``, due now, attempts
        reset; trigger the handlers once committed. Returns how many moved."""
        return operator.requeue(self, now=now).count

    def skip(self, now: datetime | None = None) -> int:
        """Mark waiting or failed messages ``skipped`` (final: they are never handled). A
        skipped message of a ``strict`` key that its key's cursor was waiting for moves
        the cursor past it and wakes its successor. Returns how many moved."""
        return operator.skip(self, now=now).count

    def waiting_for_gap(self) -> InboxMessageQuerySet:
        """Messages of ``strict`` keys that wait for an earlier sequence."""
        return self.filter(WAITING_FOR_GAP)

    def release_gaps(self, now: datetime | None = None) -> int:
        """Give up waiting: move each selected waiting message's key cursor to just before
        it (the missing sequences will be skipped if they ever come) and make it due now;
        trigger the handlers once committed. Returns how many messages were released."""
        released = 0
        with transaction.atomic(using=self.db):
            for message in self.waiting_for_gap().order_by("source", "key", "sequence"):
                assert message.sequence is not None
                InboxCursor.objects.using(self.db).filter(
                    source=message.source, key=message.key, last_sequence__lt=message.sequence - 1
                ).update(last_sequence=message.sequence - 1, updated_at=clock.now(now))
                released += (
                    InboxMessage.objects.using(self.db)
                    .filter(pk=message.pk)
                    .update(available_at=clock.now(now), last_error="gap released by an operator")
                )
            if released:
                operator.wake_on_commit(operator.part_for(self.model, self.db))
        return released

    def sources(self, limit: int = 100) -> list[str]:
        """The distinct sources of these rows, in order, at most *limit*: one index seek
        per source (``source > previous ORDER BY source LIMIT 1``, a loose index scan), so
        the cost follows the number of sources, not of rows (a plain ``DISTINCT`` reads
        the whole index: seconds at millions of rows)."""
        found: list[str] = []
        rows = self.order_by("source").values_list("source", flat=True)
        while len(found) < limit:
            following = rows.filter(source__gt=found[-1]) if found else rows
            source = following.first()
            if source is None:
                break
            found.append(source)
        return found


class InboxMessage(EngineRow):
    """One incoming message, stored once per (source, message id) by ``receive()``."""

    id = models.BigAutoField(primary_key=True)
    source = models.CharField(max_length=100, help_text="Where it came from (a configured source).")
    message_id = models.CharField(max_length=255, help_text="The sender's id: the dedup key.")
    type = models.CharField(max_length=255)
    payload = models.JSONField(encoder=DjangoJSONEncoder, null=True, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    # NULL (not "") means "no key", as in the outbox.
    key = models.CharField(  # noqa: DJ001
        max_length=255, null=True, blank=True, help_text="Ordering key (the object it is about)."
    )
    sequence = models.BigIntegerField(null=True, blank=True, help_text="Position within key.")
    correlation_id = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    state = models.CharField(
        max_length=20, choices=InboxState.choices, default=InboxState.SHOULD_BE_HANDLED
    )
    #: The body as it arrived, kept when it could not be read (not JSON, too big, no id).
    raw_body = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    # The engine's names, the inbox's columns.
    created_at = models.DateTimeField(
        default=timezone.now, db_column="received_at", verbose_name="received at"
    )
    finished_at = models.DateTimeField(
        null=True, blank=True, db_column="handled_at", verbose_name="handled at"
    )
    attempted_at = models.DateTimeField(
        null=True, blank=True, help_text="When its last handling attempt started."
    )

    objects = InboxMessageQuerySet.as_manager()

    class Meta:
        app_label = "django_outbox"
        db_table = "django_outbox_inbox"
        verbose_name = "inbox message"
        ordering = ("-id",)
        permissions = (
            ("requeue_inboxmessage", "Can requeue inbox messages"),
            ("skip_inboxmessage", "Can skip inbox messages"),
        )
        indexes = (
            # The handlers' hot query: what is due, oldest first.
            models.Index(
                fields=("available_at", "id"),
                condition=Q(state="should_be_handled"),
                name="inbox_msg_due_idx",
            ),
            models.Index(
                fields=("finished_at",),
                condition=Q(state__in=("handled", "skipped")),
                name="inbox_msg_finished_idx",
            ),
            models.Index(
                fields=("id",), condition=Q(state="handle_error"), name="inbox_msg_error_idx"
            ),
            models.Index(fields=("source", "key", "sequence"), name="inbox_msg_key_idx"),
            # The admin (migration 0017): a request's page finds its replies (source and
            # correlation id), the search a correlation id, exactly, and the start of a
            # key (pattern_ops: PostgreSQL's LIKE 'prefix%' under any collation).
            models.Index(
                fields=("correlation_id", "source"),
                condition=Q(correlation_id__isnull=False),
                name="inbox_msg_correlation_idx",
            ),
            models.Index(
                fields=("key",),
                opclasses=("varchar_pattern_ops",),
                condition=Q(key__isnull=False),
                name="inbox_msg_key_prefix_idx",
            ),
            # The admin's filters that few rows match (has an error, attempts): the
            # messages that failed at least once. PostgreSQL and SQLite (0018).
            models.Index(
                fields=("id",),
                condition=Q(attempts__gt=1) | ~Q(last_error=""),
                name="inbox_msg_troubled_idx",
            ),
            # The admin's "waiting for a gap" filter and the gap release: the messages
            # deferred behind a missing sequence, and only them. PostgreSQL and SQLite
            # (0019).
            models.Index(fields=("id",), condition=WAITING_FOR_GAP, name="inbox_msg_gap_idx"),
        )
        constraints = (
            models.UniqueConstraint(fields=("source", "message_id"), name="inbox_msg_unique"),
            models.CheckConstraint(
                condition=Q(state__in=[s.value for s in InboxState]), name="inbox_msg_state_valid"
            ),
            models.CheckConstraint(
                condition=~Q(state__in=("handled", "skipped")) | Q(finished_at__isnull=False),
                name="inbox_msg_finished_has_handled_at",
            ),
        )

    def __str__(self) -> str:
        return f"{self.type} from {self.source} [{self.state}] {self.message_id}"

    @property
    def received_at(self) -> datetime:
        return self.created_at

    @property
    def handled_at(self) -> datetime | None:
        return self.finished_at

    def requeue(self, now: datetime | None = None) -> bool:
        """Requeue this message if it is in ``handle_error``; return whether it moved."""
        moved = InboxMessage.objects.using(self._state.db).filter(pk=self.pk).requeue(now) == 1
        self.refresh_from_db()
        return moved

    def skip(self, now: datetime | None = None) -> bool:
        """Skip this message if it is waiting or failed; return whether it moved."""
        moved = InboxMessage.objects.using(self._state.db).filter(pk=self.pk).skip(now) == 1
        self.refresh_from_db()
        return moved


class InboxSeen(models.Model):
    """The message ids a partitioned inbox has stored (``outbox_partition``): its
    deduplication, which a partitioned table cannot index. Unused otherwise."""

    pk = models.CompositePrimaryKey("source", "message_id")
    source = models.CharField(max_length=100)
    message_id = models.CharField(max_length=255)
    #: The message's ``received_at``: the purge forgets ids older than every message kept.
    received_at = models.DateTimeField()

    class Meta:
        app_label = "django_outbox"
        db_table = "django_outbox_inbox_seen"
        verbose_name = "inbox message id seen"
        indexes = (models.Index(fields=("received_at",), name="inbox_seen_received_idx"),)

    def __str__(self) -> str:
        return f"{self.source}:{self.message_id}"


class InboxCursor(models.Model):
    """The last sequence handled per (source, key); locked while a message of the key is
    handled, so messages of one key are handled one at a time, in order."""

    source = models.CharField(max_length=100)
    key = models.CharField(max_length=255)
    last_sequence = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        app_label = "django_outbox"
        db_table = "django_outbox_inbox_cursor"
        constraints = (
            models.UniqueConstraint(fields=("source", "key"), name="inbox_cursor_unique"),
        )

    def __str__(self) -> str:
        return f"{self.source}/{self.key} at {self.last_sequence}"


class InboxOperations(operator.Operations):
    """The inbox's operator actions: requeue (the engine's), and skip into ``skipped``; a
    skipped message of a ``strict`` key lets its key go on."""

    def values(self, verb: operator.Verb, now: clock.Instant) -> dict[str, Any]:
        if verb is operator.Verb.SKIP:
            return {"last_error": "skipped by an operator"}
        return {}

    def moved(self, verb: operator.Verb, part: Any, rows: list[Any]) -> int:
        if verb is not operator.Verb.SKIP:
            return 0
        return pass_skipped(part.using, rows)


#: What an operator may do to incoming messages.
INBOX_OPERATIONS = operator.declare(
    InboxOperations(
        model=InboxMessage,
        skip_from=SKIPPABLE_STATES,
        columns=("source", "key", "sequence", "type"),
    )
)


def pass_skipped(using: str, skipped: list[Any]) -> int:
    """Move the cursors of ``strict`` keys past the *skipped* messages they were waiting
    for (and past any later ones skipped before), and make each key's next message due
    now. Returns how many messages were woken.

    A strict key's cursor is the last sequence handled; its next message waits for
    ``cursor + 1``. Skipping that one would leave the rest of the key waiting for a gap
    alert, so the cursor moves on, as if it had been handled. A skipped message further
    ahead moves nothing yet: its turn comes when the cursor reaches it. Keys are taken in
    (source, key) order, as the handlers lock their cursors: no deadlock with them.
    """
    from django_outbox.inbox.handlers import get_handler

    keys: dict[tuple[str, str], set[int]] = {}
    for row in skipped:
        handler = get_handler(row.type)
        if row.key is None or row.sequence is None or handler is None:
            continue
        if handler.ordering == "strict":
            keys.setdefault((row.source, row.key), set()).add(row.sequence)
    messages = InboxMessage.objects.using(using)
    cursors = InboxCursor.objects.using(using)
    woken = 0
    for (source, key), sequences in sorted(keys.items()):
        if 1 in sequences:
            # A key whose first message is skipped before any was handled has no cursor
            # yet (handlers create them as they go).
            cursors.bulk_create([InboxCursor(source=source, key=key)], ignore_conflicts=True)
        cursor = cursors.select_for_update().filter(source=source, key=key).first()
        if cursor is None or cursor.last_sequence + 1 not in sequences:
            continue
        last = cursor.last_sequence
        # Skipped earlier, further ahead: passed over now too.
        ahead = messages.filter(
            source=source, key=key, sequence__gt=last, state=InboxState.SKIPPED
        ).values_list("sequence", flat=True)
        sequences |= {sequence for sequence in ahead if sequence is not None}
        while last + 1 in sequences:
            last += 1
        cursors.filter(pk=cursor.pk).update(last_sequence=last, updated_at=clock.now())
        successor = messages.filter(
            source=source, key=key, sequence=last + 1, state=InboxState.SHOULD_BE_HANDLED
        )
        found = list(successor.values_list("pk", flat=True))
        if found:
            freed, held = wake_free(using, found)
            woken += freed
            if held:
                transaction.on_commit(lambda: wake_held(using, held), using=using)  # noqa: B023
    return woken


def wake_free(using: str, pks: list[Any]) -> tuple[int, list[Any]]:
    """Make the waiting messages *pks* due now, those no other transaction holds (never
    waiting for a row: the caller holds a key's cursor). Returns how many were woken,
    and the held ones, for ``wake_held`` once the caller's transaction has committed.

    Locked by primary key: on InnoDB a locking read through another index does not
    skip a row locked by its primary key (a claim)."""
    messages = InboxMessage.objects.using(using)
    free = list(
        messages.filter(pk__in=pks, state=InboxState.SHOULD_BE_HANDLED)
        .select_for_update(skip_locked=True)
        .values_list("pk", flat=True)
    )
    woken = messages.filter(pk__in=free).update(available_at=clock.now()) if free else 0
    return woken, sorted(set(pks) - set(free))


def wake_held(using: str, pks: list[Any]) -> int:
    """Wake the waiting messages *pks* that another transaction held when ``wake_free``
    tried, waiting for their holder this time; returns how many were woken. Call it
    holding nothing (after the commit): it cannot deadlock then.

    The holder is usually a batch that handles the message itself once it has its key's
    cursor (the message is no longer waiting when this runs); but on InnoDB it may be a
    claim that only read the row on its way (a table scan locks each row it reads), and
    skipping would leave the message to its gap alert."""
    from django_outbox.engine.retry import retry_transient

    if not pks:
        return 0
    due = InboxMessage.objects.using(using).filter(
        pk__in=pks, state=InboxState.SHOULD_BE_HANDLED, available_at__gt=clock.now()
    )
    try:
        return int(
            retry_transient(
                lambda: due.update(available_at=clock.now()),
                what="wake inbox messages",
                reconnect=using,
            )
        )
    except DatabaseError as exc:
        logger.warning(
            "could not wake %d inbox message(s) whose predecessor was handled or skipped "
            "(%s): they wait for their gap alert",
            len(pks),
            exc,
        )
        return 0
