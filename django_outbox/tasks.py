"""Celery tasks: thin wrappers over the relay and the maintenance sweeps.

Task names are stable and public (beat schedules and routes refer to them).
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.db import DEFAULT_DB_ALIAS


@shared_task(name="django_outbox.deliver_messages", ignore_result=True)
def deliver_messages(ids: list[int], using: str = DEFAULT_DB_ALIAS) -> dict[str, int]:
    """On-commit trigger: deliver *ids*, then drain what else is due."""
    from django_outbox.outbox.relay import Relay

    return Relay(using=using).deliver(ids).as_dict()


@shared_task(name="django_outbox.sweep_outbox", ignore_result=True)
def sweep_outbox(using: str = DEFAULT_DB_ALIAS) -> dict[str, Any]:
    """Beat: rescue expired leases, then deliver everything due."""
    from django_outbox.outbox.maintenance import sweep

    return sweep(using=using)


@shared_task(name="django_outbox.purge_outbox", ignore_result=True)
def purge_outbox(using: str = DEFAULT_DB_ALIAS) -> int:
    """Beat: delete finished messages older than ``RETENTION_DAYS``."""
    from django_outbox.outbox.maintenance import purge_finished_messages

    return purge_finished_messages(using=using)
