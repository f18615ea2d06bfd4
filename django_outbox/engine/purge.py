"""Deleting finished rows in bounded batches."""

from __future__ import annotations

from typing import Any

from django.db import models


def purge_in_batches(
    queryset: models.QuerySet[Any], *, batch_size: int, max_batches: int | None = None
) -> int:
    """Delete the rows of *queryset* *batch_size* at a time; return how many.

    Each batch is one SELECT of ids (served by a partial index) and one DELETE
    by primary key, so a batch costs the same however large the table is.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    total = 0
    batches = 0
    while max_batches is None or batches < max_batches:
        ids = list(queryset.order_by().values_list("pk", flat=True)[:batch_size])
        if not ids:
            break
        deleted, _ = queryset.filter(pk__in=ids).delete()
        total += deleted
        batches += 1
        if len(ids) < batch_size:
            break
    return total
