"""The inbox's maintenance: the sweep (handle what a lost trigger left) and the purge."""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS

from django_outbox.engine import sweeps
from django_outbox.inbox.handling import Handling, Inbox


def sweep(*, using: str = DEFAULT_DB_ALIAS, time_budget: float | None = None) -> dict[str, Any]:
    """One pass: mark the sweep, then handle everything due. Nothing is ever stuck in
    the inbox (a crashed handler's transaction rolls back), so there is nothing to rescue."""
    sweeps.rescue_stuck(Handling(using=using))
    return Inbox(using=using).drain(time_budget=time_budget).as_dict()


def purge(*, using: str = DEFAULT_DB_ALIAS) -> int:
    """Delete handled and skipped messages past ``RETENTION_DAYS``: after that a
    redelivered duplicate is no longer recognised (the deduplication window)."""
    return sweeps.purge_finished(Handling(using=using))
