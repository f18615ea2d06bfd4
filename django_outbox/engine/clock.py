"""One clock for every deadline: the database's.

Web hosts, workers and beat disagree about the time by milliseconds to
seconds. A due time written with one host's clock and compared with
another's makes a fresh message "not due yet" (its trigger finds nothing),
and a lease measured on a host that runs ahead is taken from a healthy
worker. So due times, leases and heartbeats are written *and* compared as
SQL expressions over the database's ``now()``: every host reads the same
clock. Tests and operators may pin ``now`` to a fixed datetime instead.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import DateTimeField, DurationField, ExpressionWrapper, Value
from django.db.models.expressions import Combinable
from django.db.models.functions import Now

#: A point in time as SQL: the database's ``now()`` or a pinned value.
Instant = Combinable


class DatabaseNow(Now):
    """Django's ``Now()``, except in UTC on MySQL/MariaDB whatever the session's time
    zone (``CURRENT_TIMESTAMP`` there follows it; Django stores UTC)."""

    def as_mysql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, template="UTC_TIMESTAMP(6)", **extra)


def now(at: datetime | None = None) -> Instant:
    """The database's current time, or *at* when a caller pins the clock."""
    if at is None:
        return DatabaseNow()
    return Value(at, output_field=DateTimeField())


def later(instant: Instant, seconds: float) -> Instant:
    """*instant* plus *seconds* (negative for earlier), still as SQL."""
    delta = Value(timedelta(seconds=seconds), output_field=DurationField())
    return ExpressionWrapper(instant + delta, output_field=DateTimeField())


def sql_for(instant: Instant, queryset: Any) -> tuple[str, list[Any]]:
    """Compile *instant* for a raw statement on *queryset*'s database."""
    query = queryset.query.chain()
    compiler = query.get_compiler(using=queryset.db)
    resolved = instant.resolve_expression(query)  # type: ignore[attr-defined]
    sql, params = compiler.compile(resolved)
    return sql, list(params)


def read_now(using: str) -> datetime:
    """The database's current time as a value (one query): for a time that is written
    and also handed to code in this process, so both say the same."""
    from django.db import connections
    from django.utils import timezone

    connection = connections[using]
    sql = {
        "postgresql": "SELECT STATEMENT_TIMESTAMP()",
        "mysql": "SELECT UTC_TIMESTAMP(6)",
        "sqlite": "SELECT STRFTIME('%Y-%m-%d %H:%M:%f', 'NOW')",
    }.get(connection.vendor)
    if sql is None:
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(sql)
        value = cursor.fetchone()[0]
    if isinstance(value, str):  # SQLite: text, UTC
        value = datetime.fromisoformat(value)
    moment: datetime = value
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, UTC)
    return moment
