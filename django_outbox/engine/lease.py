"""Claiming rows under a lease and recording outcomes with fencing."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import models, transaction
from django.db.models import Case, F, Value, When

M = TypeVar("M", bound=models.Model)


@dataclass(frozen=True)
class Lease:
    """A claim on rows until ``until``; ``token`` fences late writers out."""

    token: uuid.UUID
    until: datetime

    @classmethod
    def new(cls, now: datetime, seconds: float) -> Lease:
        """A fresh lease starting at *now* lasting *seconds*."""
        return cls(token=uuid.uuid4(), until=now + timedelta(seconds=seconds))


def claim(
    queryset: models.QuerySet[M],
    *,
    lease: Lease,
    limit: int,
    running_state: str,
) -> list[M]:
    """Claim up to *limit* rows of *queryset* under *lease* and return them.

    Rows locked by another claimer are skipped (``FOR UPDATE SKIP LOCKED``
    where the database has it). The UPDATE re-applies *queryset*'s filter, so
    on databases without row locks (SQLite, which serialises writers) a row
    that stopped matching is not taken. ``attempts`` is counted here, so a
    message that kills its sender every time still runs out of attempts.
    Must run inside ``transaction.atomic``.
    """
    if not transaction.get_connection(queryset.db).in_atomic_block:
        raise RuntimeError("claim() must run inside transaction.atomic()")
    features = transaction.get_connection(queryset.db).features
    model = queryset.model
    locked = queryset.select_for_update(
        skip_locked=True, of=("self",) if features.has_select_for_update_of else ()
    )
    rows = list(locked[:limit])
    if not rows:
        return []
    ids = [row.pk for row in rows]
    if features.has_select_for_update:
        # The rows are locked by us: updating by primary key is enough (and
        # MySQL refuses a subquery on the table being updated).
        target = model._default_manager.using(queryset.db).filter(pk__in=ids)
    else:
        target = queryset.filter(pk__in=ids)
    updated = target.update(
        state=running_state,
        locked_until=lease.until,
        lock_token=lease.token,
        attempts=F("attempts") + 1,
    )
    if updated != len(rows):
        # Another writer got some rows between our SELECT and UPDATE (only
        # possible without row locks): keep exactly what carries our token.
        return list(
            model._default_manager.using(queryset.db).filter(pk__in=ids, lock_token=lease.token)
        )
    for row in rows:
        row.state = running_state  # type: ignore[attr-defined]
        row.locked_until = lease.until  # type: ignore[attr-defined]
        row.lock_token = lease.token  # type: ignore[attr-defined]
        row.attempts += 1  # type: ignore[attr-defined]
    return rows


def fenced(
    model: type[M], ids: Sequence[Any], lease: Lease, running_state: str, using: str
) -> models.QuerySet[M]:
    """Rows among *ids* still held under *lease*: the only ones a holder may change."""
    return model._default_manager.using(using).filter(
        pk__in=ids, lock_token=lease.token, state=running_state
    )


def update_each(queryset: models.QuerySet[M], values: Mapping[Any, Mapping[str, Any]]) -> int:
    """Set per-row field values (``{pk: {field: value}}``) in one UPDATE.

    Only rows that *queryset* still matches are changed; returns how many.
    """
    if not values:
        return 0
    fields = sorted({name for row in values.values() for name in row})
    model = queryset.model
    assignments: dict[str, Any] = {}
    for name in fields:
        output = model._meta.get_field(name)
        whens = [
            When(pk=pk, then=Value(row[name], output_field=output))  # type: ignore[arg-type]
            for pk, row in values.items()
            if name in row
        ]
        assignments[name] = Case(*whens, default=F(name), output_field=output)  # type: ignore[arg-type]
    return queryset.filter(pk__in=list(values)).update(**assignments)
