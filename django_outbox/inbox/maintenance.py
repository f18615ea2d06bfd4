"""The inbox's maintenance: the sweep (handle what a lost trigger left, give back the
claims of dead workers) and the purge."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from django_outbox.engine import heartbeat, partitions, sweeps
from django_outbox.inbox.handling import Handling, Inbox
from django_outbox.inbox.models import InboxMessage, InboxSeen


def sweep(*, using: str = DEFAULT_DB_ALIAS, time_budget: float | None = None) -> dict[str, Any]:
    """One pass: mark the sweep, give back the claims of workers proven dead (a
    handler's transaction dies with its worker, its claim is cleared), then handle
    everything due (lost triggers, retries that came due, claims whose lease ran out)."""
    sweeps.rescue_stuck(Handling(using=using))
    given_back = heartbeat.rescue_dead_workers(using).get(Handling.name, 0)
    drained = Inbox(using=using).drain(time_budget=time_budget)
    return {"given_back": given_back, **drained.as_dict()}


def purge(
    *,
    using: str = DEFAULT_DB_ALIAS,
    older_than: timedelta | None = None,
    batch_size: int | None = None,
) -> int:
    """Delete handled and skipped messages past ``RETENTION_DAYS`` (or *older_than*):
    after that a redelivered duplicate is no longer recognised (the deduplication
    window). Cursors of ordered keys are kept (see docs/operations.md)."""
    part = Handling(using=using)
    deleted = sweeps.purge_finished(part, older_than=older_than, batch_size=batch_size)
    if partitions.is_partitioned(InboxMessage, using):
        forgotten = partitions.purge_seen(
            InboxMessage, InboxSeen, using, batch_size or part.config.purge_batch_size
        )
        if forgotten:
            part.logger.info("forgot %d message id(s) older than every message kept", forgotten)
    return deleted
