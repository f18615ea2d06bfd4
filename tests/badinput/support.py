"""What every bad-input test proves: the rows of every table, before and after."""

from __future__ import annotations

import pytest
from django.apps import apps

from tests.badinput.cases import Case, EntryPoint

#: Bookkeeping, not input: worker heartbeats, sweep marks, per-minute counts.
BOOKKEEPING = frozenset({"Worker", "SweepMark", "MinuteCount"})


def table_counts() -> dict[str, int]:
    """Rows per table of django_outbox (messages, jobs, their keys, cursors and batches)
    and the shop's business table."""
    models = [
        model
        for model in apps.get_app_config("django_outbox").get_models()
        if model._meta.managed and not model._meta.proxy and model.__name__ not in BOOKKEEPING
    ]
    models.append(apps.get_model("shop", "Payment"))
    return {model._meta.db_table: model._default_manager.count() for model in models}


def grown(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The tables whose row count changed, and by how much."""
    return {table: after[table] - before[table] for table in after if after[table] != before[table]}


def params(entry: EntryPoint) -> list[object]:
    """pytest params of *entry*'s cases, each with the markers it needs."""
    return [
        pytest.param(case, id=case.id, marks=[getattr(pytest.mark, m) for m in case.needs])
        for case in entry.cases
    ]


def run_case_ids(case: Case) -> str:
    return case.id
