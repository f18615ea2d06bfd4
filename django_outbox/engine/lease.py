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
    fields: Sequence[str] | None = None,
) -> list[M]:
    """Claim up to *limit* rows of *queryset* under *lease* and return them.

    Rows locked by another claimer are skipped (``FOR UPDATE SKIP LOCKED``
    where the database has it). The UPDATE re-applies *queryset*'s filter, so
    on databases without row locks (SQLite, which serialises writers) a row
    that stopped matching is not taken. ``attempts`` is counted here, so a
    message that kills its sender every time still runs out of attempts.
    *fields* limits the columns read back (the rest are deferred; the lease
    fields are always set). Runs its own transaction where it needs one.
    """
    connection = transaction.get_connection(queryset.db)
    if connection.vendor == "postgresql":
        return _claim_returning(
            queryset, lease=lease, limit=limit, running_state=running_state, fields=fields
        )
    with transaction.atomic(using=queryset.db):
        return _claim_select_then_update(
            queryset, lease=lease, limit=limit, running_state=running_state, fields=fields
        )


def _claim_select_then_update(
    queryset: models.QuerySet[M],
    *,
    lease: Lease,
    limit: int,
    running_state: str,
    fields: Sequence[str] | None,
) -> list[M]:
    """Any database: lock (where possible) and read, then lease by primary key."""
    features = transaction.get_connection(queryset.db).features
    model = queryset.model
    locked = queryset.select_for_update(
        skip_locked=True, of=("self",) if features.has_select_for_update_of else ()
    )
    if fields is not None:
        locked = locked.only(*fields)
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


def _claim_returning(
    queryset: models.QuerySet[M],
    *,
    lease: Lease,
    limit: int,
    running_state: str,
    fields: Sequence[str] | None,
) -> list[M]:
    """PostgreSQL: lock, lease and read the batch in one ``UPDATE … RETURNING``.

    One round trip, no transaction around it and no list of ids on the wire:
    at 500 rows a batch the separate SELECT and ``id IN (…)`` UPDATE cost as
    much as the publish. ``FOR UPDATE SKIP LOCKED`` applies to the subquery's
    own table only (the filter's EXISTS sublinks lock nothing).
    """
    model = queryset.model
    connection = transaction.get_connection(queryset.db)
    q = connection.ops.quote_name
    meta = model._meta
    pk_column = q(meta.pk.column)
    subquery = queryset.values("pk")[:limit].query
    select_sql, select_params = subquery.get_compiler(using=queryset.db).as_sql()
    select_sql += " FOR UPDATE SKIP LOCKED"
    wanted = [f for f in (meta.concrete_fields if fields is None else map(meta.get_field, fields))]
    columns = ", ".join(q(f.column) for f in wanted)  # type: ignore[union-attr]
    sql = (
        f"UPDATE {q(meta.db_table)} SET {q('state')} = %s, {q('locked_until')} = %s, "
        f"{q('lock_token')} = %s, {q('attempts')} = {q('attempts')} + 1 "
        f"WHERE {pk_column} IN ({select_sql}) RETURNING {columns}"
    )
    params = (running_state, lease.until, lease.token, *select_params)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        records = cursor.fetchall()
    names = [f.attname for f in wanted]  # type: ignore[union-attr]
    converters = [(i, f) for i, f in enumerate(wanted) if hasattr(f, "from_db_value")]
    rows = []
    for record in records:
        values = list(record)
        raw = {}
        for i, field in converters:
            if isinstance(field, models.JSONField):
                # Keep the JSON text too: a transport can send it as-is.
                raw[f"{field.attname}_json"] = values[i]
                if values[i] == "{}":  # most headers: skip the decoder
                    values[i] = {}
                    continue
            values[i] = field.from_db_value(values[i], None, connection)
        row = model.from_db(queryset.db, names, values)
        row.__dict__.update(
            raw, state=running_state, locked_until=lease.until, lock_token=lease.token
        )
        rows.append(row)
    return rows


def with_ids(queryset: models.QuerySet[M], ids: Sequence[Any]) -> models.QuerySet[M]:
    """*queryset* narrowed to primary keys *ids*.

    On PostgreSQL the ids travel as one array parameter (``= ANY(%s)``): a
    500-item ``IN (…)`` list costs more to build and parse than the UPDATE
    it selects for.
    """
    connection = transaction.get_connection(queryset.db)
    if connection.vendor != "postgresql":
        return queryset.filter(pk__in=list(ids))
    meta = queryset.model._meta
    q = connection.ops.quote_name
    column = f"{q(meta.db_table)}.{q(meta.pk.column)}"
    return queryset.extra(where=[f"{column} = ANY(%s)"], params=[list(ids)])


def fenced(model: type[M], lease: Lease, running_state: str, using: str) -> models.QuerySet[M]:
    """Rows still held under *lease*: the only ones its holder may change.

    Once a sweep recovers an expired lease it clears the token, so a late
    writer's UPDATE through this queryset matches nothing.
    """
    return model._default_manager.using(using).filter(lock_token=lease.token, state=running_state)


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
    return with_ids(queryset, list(values)).update(**assignments)
