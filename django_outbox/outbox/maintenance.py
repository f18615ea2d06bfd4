"""Maintenance sweeps: rescue expired leases, purge finished rows.

Each sweep has the same shape: a function that does one bounded pass and
returns counts, logging only when it changed something.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.models import Q
from django.utils import timezone

from django_outbox import signals
from django_outbox.conf import OutboxSettings, get_settings
from django_outbox.engine import purge_in_batches
from django_outbox.outbox.models import OutboxMessage, OutboxState

logger = logging.getLogger("django_outbox.maintenance")


@dataclass(frozen=True)
class RescueResult:
    """What ``rescue_stuck_messages`` did."""

    resent: int = 0
    held: int = 0


def rescue_stuck_messages(
    *,
    now: datetime | None = None,
    using: str = DEFAULT_DB_ALIAS,
    config: OutboxSettings | None = None,
) -> RescueResult:
    """Recover ``sending`` rows whose lease expired: their sender died mid-publish.

    The outcome is uncertain (the broker may or may not have the message).
    Under the destination's ``resend`` policy the row goes back to
    ``should_be_sent`` (at-least-once); under ``hold``, or when its attempts
    are used up, it goes to ``send_error`` marked uncertain for an operator.
    Clearing the lease token fences the dead sender out.
    """
    config = config or get_settings()
    now = now or timezone.now()
    hold = [name for name, d in config.destinations.items() if d.uncertain == "hold"]
    stuck = OutboxMessage.objects.using(using).stuck(now)
    note = f"lease expired at {now.isoformat()} while sending: outcome uncertain"
    exhausted = Q()
    for name, destination in config.destinations.items():
        exhausted |= Q(destination=name, attempts__gte=destination.max_attempts)
    unknown = ~Q(destination__in=list(config.destinations))
    exhausted |= unknown & Q(attempts__gte=config.max_attempts)
    with transaction.atomic(using=using):
        held = stuck.filter(Q(destination__in=hold) | exhausted).update(
            state=OutboxState.SEND_ERROR,
            uncertain=True,
            locked_until=None,
            lock_token=None,
            last_error=f"{note}; held for an operator",
        )
        resent = stuck.update(
            state=OutboxState.SHOULD_BE_SENT,
            available_at=now,
            locked_until=None,
            lock_token=None,
            last_error=f"{note}; resending",
        )
    if resent or held:
        logger.warning(
            "rescued %d stuck message(s): %d resent, %d held", resent + held, resent, held
        )
        signals.emit(
            signals.outbox_messages_rescued, rescue_stuck_messages, resent=resent, held=held
        )
    return RescueResult(resent=resent, held=held)


def purge_finished_messages(
    *,
    now: datetime | None = None,
    older_than: timedelta | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    using: str = DEFAULT_DB_ALIAS,
    config: OutboxSettings | None = None,
) -> int:
    """Delete ``sent`` and ``cancelled`` rows finished more than *older_than* ago.

    *older_than* defaults to ``RETENTION_DAYS``; rows go ``batch_size``
    (``PURGE_BATCH_SIZE``) at a time. Returns how many rows were deleted.
    """
    config = config or get_settings()
    now = now or timezone.now()
    age = older_than if older_than is not None else timedelta(days=config.retention_days)
    deleted = purge_in_batches(
        OutboxMessage.objects.using(using).purgeable(now - age),
        batch_size=batch_size or config.purge_batch_size,
        max_batches=max_batches,
    )
    if deleted:
        logger.info("purged %d finished outbox message(s)", deleted)
    return deleted


def sweep(
    *, using: str = DEFAULT_DB_ALIAS, now: datetime | None = None, time_budget: float | None = None
) -> dict[str, Any]:
    """One recovery pass: rescue expired leases, then drain due messages."""
    from django_outbox.outbox.relay import Relay

    rescued = rescue_stuck_messages(now=now, using=using)
    relay = Relay(using=using, clock=(lambda: now) if now is not None else timezone.now)
    drained = relay.drain(time_budget=time_budget)
    return {"resent": rescued.resent, "held": rescued.held, **drained.as_dict()}
