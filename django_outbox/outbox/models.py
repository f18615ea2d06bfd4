"""Outgoing messages: the outbox table and the per-key sequence counters."""

from __future__ import annotations

from datetime import datetime

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Q

from django_outbox.engine import operator
from django_outbox.engine.fields import KeptJSONField
from django_outbox.engine.ids import uuid7
from django_outbox.engine.models import EngineRow


class OutboxState(models.TextChoices):
    """States of an outgoing message; the names are public (admin, metrics, docs)."""

    #: Waiting to be published once ``available_at`` has passed. Entered by
    #: ``send()``, a retryable failure, lease recovery (resend) or requeue.
    SHOULD_BE_SENT = "should_be_sent", "should be sent"
    #: Claimed by a relay under a lease (``locked_until``/``lock_token``).
    SENDING = "sending", "sending"
    #: Published and confirmed by the transport. Final; purged after retention.
    SENT = "sent", "sent"
    #: Dead-lettered: permanent failure, attempts exhausted, or an uncertain
    #: outcome under the ``hold`` policy. Waits for an operator.
    SEND_ERROR = "send_error", "send error"
    #: Cancelled by an operator. Final; purged after retention.
    CANCELLED = "cancelled", "cancelled"


#: States in which a message still blocks later messages of its key.
UNFINISHED_STATES = (OutboxState.SHOULD_BE_SENT, OutboxState.SENDING, OutboxState.SEND_ERROR)
#: States whose rows the purge deletes once past retention.
FINISHED_STATES = (OutboxState.SENT, OutboxState.CANCELLED)
#: States from which an operator may requeue or cancel (``OUTBOX_OPERATIONS``).
REQUEUEABLE_STATES = (OutboxState.SEND_ERROR,)
CANCELLABLE_STATES = (OutboxState.SHOULD_BE_SENT, OutboxState.SEND_ERROR)


class OutboxMessageQuerySet(models.QuerySet["OutboxMessage"]):
    """Operator actions over outgoing messages (the engine's, see ``engine.operator``).
    The relay's selection of due messages is the engine's too: ``Publishing().due()``."""

    def requeue(self, now: datetime | None = None) -> int:
        """Move ``send_error`` messages back to ``should_be_sent``, due now, attempts reset
        and ``uncertain`` cleared; trigger the relay once committed. Returns how many
        moved."""
        return operator.requeue(self, now=now).count

    def cancel(self, now: datetime | None = None) -> int:
        """Cancel messages that are not being sent and not finished; the messages parked
        behind a cancelled one of their key are released. Returns how many moved."""
        return operator.cancel(self, now=now).count


class OutboxMessage(EngineRow):
    """One outgoing message, inserted in the caller's transaction by ``send()``."""

    id = models.BigAutoField(primary_key=True)
    message_id = models.UUIDField(
        default=uuid7, unique=True, editable=False, help_text="Idempotency key."
    )
    type = models.CharField(max_length=255)
    destination = models.CharField(max_length=100)
    #: A claim keeps its text (``payload_json``): the relay sends the payload as it was
    #: stored, neither decoded nor encoded again (``KeptJSONField``).
    payload = KeptJSONField(encoder=DjangoJSONEncoder)
    headers = models.JSONField(default=dict, blank=True)
    # NULL (not "") means "no key": the key/sequence CHECK and the partial
    # unique index rely on it.
    key = models.CharField(  # noqa: DJ001
        max_length=255, null=True, blank=True, help_text="Ordering key."
    )
    sequence = models.BigIntegerField(null=True, blank=True, help_text="Position within key.")
    correlation_id = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    state = models.CharField(
        max_length=20, choices=OutboxState.choices, default=OutboxState.SHOULD_BE_SENT
    )
    uncertain = models.BooleanField(
        default=False, help_text="The sender died mid-publish: it may or may not have arrived."
    )
    # Database defaults too: during a rolling deploy, processes of the previous
    # release still insert rows without these columns.
    blocked = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Waits behind a failed earlier message of its key (kept out of the due index).",
    )
    blocking = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Failed while later messages of its key wait behind it.",
    )
    sent_at = models.DateTimeField(null=True, blank=True)
    attempted_at = models.DateTimeField(
        null=True, blank=True, help_text="When its last publish attempt started."
    )

    objects = OutboxMessageQuerySet.as_manager()

    class Meta:
        app_label = "django_outbox"
        db_table = "django_outbox_message"
        verbose_name = "outbox message"
        ordering = ("-id",)
        permissions = (
            ("requeue_outboxmessage", "Can requeue outbox messages"),
            ("cancel_outboxmessage", "Can cancel outbox messages"),
        )
        indexes = (
            # The relay's hot query: what is due, oldest first.
            # Messages parked behind a failed one of their key are not in it:
            # a parked key costs the claim nothing, however long its queue.
            models.Index(
                fields=("available_at", "id"),
                condition=Q(state="should_be_sent", blocked=False),
                name="outbox_msg_due_idx",
            ),
            models.Index(
                fields=("locked_until",), condition=Q(state="sending"), name="outbox_msg_lease_idx"
            ),
            # Recording outcomes finds a batch by its lease token.
            models.Index(
                fields=("lock_token",), condition=Q(state="sending"), name="outbox_msg_token_idx"
            ),
            # Rescue of a dead worker's rows.
            models.Index(
                fields=("claimed_by",), condition=Q(state="sending"), name="outbox_msg_worker_idx"
            ),
            # Ordering check: is an earlier message of this key unfinished?
            models.Index(
                fields=("destination", "key", "sequence"),
                condition=Q(state__in=("should_be_sent", "sending", "send_error"))
                & Q(key__isnull=False),
                name="outbox_msg_key_open_idx",
            ),
            models.Index(
                fields=("finished_at",),
                condition=Q(state__in=("sent", "cancelled")),
                name="outbox_msg_finished_idx",
            ),
            models.Index(
                fields=("id",), condition=Q(state="send_error"), name="outbox_msg_error_idx"
            ),
            # The admin (migration 0017): a reply's page finds its request, the search a
            # correlation id, exactly, and the start of a key (pattern_ops: PostgreSQL's
            # LIKE 'prefix%' under any collation; ignored elsewhere).
            models.Index(
                fields=("correlation_id",),
                condition=Q(correlation_id__isnull=False),
                name="outbox_msg_correlation_idx",
            ),
            models.Index(
                fields=("key",),
                opclasses=("varchar_pattern_ops",),
                condition=Q(key__isnull=False),
                name="outbox_msg_key_prefix_idx",
            ),
            # The admin's filters that few rows match (has an error, attempts, uncertain):
            # the messages that failed at least once. PostgreSQL and SQLite (0018).
            models.Index(
                fields=("id",),
                condition=Q(attempts__gt=1) | ~Q(last_error="") | Q(uncertain=True),
                name="outbox_msg_troubled_idx",
            ),
            # The health page's figures (``django_outbox.health``): the messages parked
            # behind a failed key, and the failed ones held as uncertain. Rows enter
            # them rarely; PostgreSQL and SQLite only (migration 0016).
            models.Index(
                fields=("destination", "key"),
                condition=Q(state="should_be_sent", blocked=True),
                name="outbox_msg_parked_idx",
            ),
            models.Index(
                fields=("id",),
                condition=Q(state="send_error", uncertain=True),
                name="outbox_msg_uncertain_idx",
            ),
        )
        constraints = (
            models.CheckConstraint(
                condition=Q(state__in=[s.value for s in OutboxState]), name="outbox_msg_state_valid"
            ),
            models.CheckConstraint(
                condition=~Q(state="sent") | Q(sent_at__isnull=False),
                name="outbox_msg_sent_has_sent_at",
            ),
            models.CheckConstraint(
                condition=~Q(state__in=("sent", "cancelled")) | Q(finished_at__isnull=False),
                name="outbox_msg_finished_has_finished_at",
            ),
            models.CheckConstraint(
                condition=~Q(state="sending")
                | (Q(locked_until__isnull=False) & Q(lock_token__isnull=False)),
                name="outbox_msg_sending_has_lease",
            ),
            models.CheckConstraint(
                condition=Q(key__isnull=True, sequence__isnull=True)
                | Q(key__isnull=False, sequence__isnull=False),
                name="outbox_msg_key_has_sequence",
            ),
            models.UniqueConstraint(
                fields=("destination", "key", "sequence"),
                condition=Q(key__isnull=False),
                name="outbox_msg_key_sequence_unique",
            ),
        )

    def __str__(self) -> str:
        return f"{self.type} → {self.destination} [{self.state}] {self.message_id}"

    def requeue(self, now: datetime | None = None) -> bool:
        """Requeue this message if it is in ``send_error``; return whether it moved."""
        moved = OutboxMessage.objects.using(self._state.db).filter(pk=self.pk).requeue(now) == 1
        self.refresh_from_db()
        return moved

    def cancel(self, now: datetime | None = None) -> bool:
        """Cancel this message if it is not sending or finished; return whether it moved."""
        moved = OutboxMessage.objects.using(self._state.db).filter(pk=self.pk).cancel(now) == 1
        self.refresh_from_db()
        return moved


#: What an operator may do to outgoing messages: requeue (the engine's), and cancel what
#: is not being sent nor finished into ``cancelled``.
OUTBOX_OPERATIONS = operator.declare(
    operator.Operations(
        model=OutboxMessage,
        cancel_from=CANCELLABLE_STATES,
        cancelled=OutboxState.CANCELLED,
    )
)


class OutboxKey(models.Model):
    """Last sequence number handed out per (destination, key)."""

    destination = models.CharField(max_length=100)
    key = models.CharField(max_length=255)
    last_sequence = models.BigIntegerField(default=0)
    blocked = models.BooleanField(
        default=False,
        db_default=False,
        help_text="A message of this key failed: new ones are sent parked.",
    )

    class Meta:
        app_label = "django_outbox"
        db_table = "django_outbox_key"
        constraints = (
            models.UniqueConstraint(fields=("destination", "key"), name="outbox_key_unique"),
        )

    def __str__(self) -> str:
        return f"{self.destination}:{self.key} @ {self.last_sequence}"
