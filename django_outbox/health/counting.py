"""Counts whose cost does not grow with the table: up to a cap, or the planner's estimate.

An exact ``COUNT(*)`` of a state reads every row in it: on a table of millions of
finished rows that is seconds, on every refresh of a page or a probe. Here a count
stops at ``COUNT_CAP`` (it reads at most that many index entries: the states an
operator watches have partial indexes), and the finished states of a large
PostgreSQL table are what the query planner expects from the table's statistics
(``EXPLAIN``, no row read), as fresh as the last ``ANALYZE``. Each count says which it
is, so that a page can write "10,000+" or "≈4,950,000" and a probe can tell.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from django.db import connections
from django.db.models import Count as SqlCount
from django.db.models import Model, QuerySet, Value

#: A count stops here; the figure then reads "10,000+".
COUNT_CAP = 10_000
#: From this many rows (PostgreSQL's statistics), the finished states of a table are
#: estimated rather than counted: a rare final state (``cancelled``) has no index, and
#: counting it would read the table.
LARGE_TABLE_ROWS = 100_000

Kind = Literal["exact", "capped", "estimate"]
_WEIGHT = {"exact": 0, "estimate": 1, "capped": 2}


@dataclass(frozen=True)
class Count:
    """A number of rows: ``exact``, ``capped`` (at least ``value``: the count stopped
    there) or an ``estimate`` (the planner's, from the table's statistics)."""

    value: int
    kind: Kind = "exact"

    def __str__(self) -> str:
        if self.kind == "capped":
            return f"{self.value:,}+"
        if self.kind == "estimate":
            return f"≈{self.value:,}"
        return f"{self.value:,}"

    def __bool__(self) -> bool:
        return self.value > 0

    def __add__(self, other: Count) -> Count:
        kind = max(self.kind, other.kind, key=_WEIGHT.__getitem__)
        return Count(self.value + other.value, kind)

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "kind": self.kind}


def capped(rows: QuerySet[Any], cap: int | None = None) -> Count:
    """How many *rows* there are, counting no further than *cap* (``COUNT_CAP``):
    ``SELECT COUNT(*) FROM (… LIMIT cap + 1)``."""
    cap = COUNT_CAP if cap is None else cap
    if rows.query.distinct:
        found = rows.order_by()[: cap + 1].count()
    else:
        # A constant, not the primary key: any index that covers the filter answers
        # without reading the table (an index-only scan).
        limited = rows.order_by().annotate(counted=Value(1)).values("counted")[: cap + 1]
        found = limited.aggregate(found=SqlCount("counted"))["found"]
    if found > cap:
        return Count(cap, "capped")
    return Count(found)


def table_rows(model: type[Model], using: str) -> int | None:
    """The number of rows of *model*'s table as PostgreSQL last measured it
    (``pg_class.reltuples``); ``None`` elsewhere or before the first ``ANALYZE``."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
            [connection.ops.quote_name(model._meta.db_table)],
        )
        row = cursor.fetchone()
    if row is None or row[0] is None or row[0] < 0:
        return None
    return int(row[0])


def planned(rows: QuerySet[Any]) -> int | None:
    """How many *rows* PostgreSQL's planner expects (``EXPLAIN``: nothing is read);
    ``None`` on other databases."""
    connection = connections[rows.db]
    if connection.vendor != "postgresql":
        return None
    sql, params = rows.order_by().values("pk").query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


def estimated(rows: QuerySet[Any], *, large: bool) -> Count:
    """The planner's estimate of *rows* when their table is *large* (and the database
    is PostgreSQL), else a capped count."""
    if large:
        expected = planned(rows)
        if expected is not None:
            return Count(expected, "estimate")
    return capped(rows)


__all__ = ["COUNT_CAP", "LARGE_TABLE_ROWS", "Count", "capped", "estimated", "planned"]
