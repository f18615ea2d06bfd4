"""The outbox's maintenance sweeps: the engine's sweeps applied to outgoing messages."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from django_outbox.conf import Settings
from django_outbox.engine import heartbeat, sweeps
from django_outbox.engine.sweeps import RescueResult
from django_outbox.outbox.relay import Publishing, Relay


def rescue_stuck_messages(
    *,
    now: datetime | None = None,
    using: str = DEFAULT_DB_ALIAS,
    config: Settings | None = None,
) -> RescueResult:
    """Recover ``sending`` rows whose lease expired: their sender died mid-publish.

    Under the destination's ``resend`` policy the row goes back to
    ``should_be_sent`` (at-least-once); under ``hold``, or when its attempts
    are used up, it goes to ``send_error`` marked uncertain for an operator.
    *now* pins the time (default: the database's clock).
    """
    return sweeps.rescue_stuck(Publishing(using=using, config=config), at=now)


def purge_finished_messages(
    *,
    now: datetime | None = None,
    older_than: timedelta | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    using: str = DEFAULT_DB_ALIAS,
    config: Settings | None = None,
) -> int:
    """Delete ``sent`` and ``cancelled`` rows finished more than *older_than* ago.

    *older_than* defaults to ``RETENTION_DAYS``; rows go ``batch_size``
    (``PURGE_BATCH_SIZE``) at a time. Returns how many rows were deleted.
    """
    return sweeps.purge_finished(
        Publishing(using=using, config=config),
        older_than=older_than,
        batch_size=batch_size,
        max_batches=max_batches,
        at=now,
    )


def sweep(
    *, using: str = DEFAULT_DB_ALIAS, now: datetime | None = None, time_budget: float | None = None
) -> dict[str, Any]:
    """One recovery pass: rescue expired leases and the rows of workers proven dead
    (``engine.heartbeat.dead_workers``: silent while another worker beat without a gap,
    so a sweep run after a database outage judges nobody), then drain."""
    rescued = rescue_stuck_messages(now=now, using=using)
    from_dead = heartbeat.rescue_dead_workers(using).get(Publishing.name, 0) if now is None else 0
    relay = Relay(using=using, clock=(lambda: now) if now is not None else None)
    drained = relay.drain(time_budget=time_budget)
    return {
        "resent": rescued.resent + from_dead,
        "held": rescued.held,
        **drained.as_dict(),
    }
