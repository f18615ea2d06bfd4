"""Autovacuum for the queue tables on PostgreSQL: by dead rows, whatever the table holds.

Every claim scans a due index (``outbox_msg_due_idx``, ``outbox_job_due_idx``, …) from
its start. Each row that leaves the due state leaves its index entry behind, dead,
and only VACUUM takes it out: until then each claim walks over the dead entries of
every row processed since the last vacuum. In an eight-minute soak of about 640 items/s
with no vacuum (``tests/benchmarks/soak.py``), the blocks one job claim's scan read grew
from 31 to 415, about 50 more a minute, without bound.

PostgreSQL's default vacuums a table once a fifth of its rows are dead
(``autovacuum_vacuum_scale_factor`` 0.2): with 5 million finished rows kept, a
million rows processed between vacuums. The queue tables are therefore given a fixed
threshold instead (``OPTIONS``): vacuumed once some thousands of rows are dead, as
often as the autovacuum launcher comes by (``autovacuum_naptime``, a minute by
default), however many finished rows they keep. ``vacuum_index_cleanup = on`` keeps
PostgreSQL 14's shortcut of skipping the indexes when few heap pages hold dead rows
from leaving those entries in place: they are the ones the claims read.

Set by migration ``0022`` on the plain tables, and on every partition
``engine.partitions`` makes. An operator may change them with ``ALTER TABLE … SET``
or ``RESET``; nothing sets them again. Autovacuum itself must be on
(``autovacuum = on``, PostgreSQL's default): see ``docs/operations.md``.
"""

from __future__ import annotations

from typing import Any

#: The tables whose rows pass through a due index (the claims' queues).
QUEUE_TABLES = ("django_outbox_message", "django_outbox_inbox", "django_outbox_job")

#: The storage parameters the queue tables (and each of their partitions) get.
OPTIONS = (
    ("autovacuum_vacuum_scale_factor", "0"),
    ("autovacuum_vacuum_threshold", "5000"),
    ("vacuum_index_cleanup", "on"),
)


def clause() -> str:
    """``WITH (…)`` of a ``CREATE TABLE``: the storage parameters of a queue table."""
    return "WITH (" + ", ".join(f"{name} = {value}" for name, value in OPTIONS) + ")"


def _targets(cursor: Any, table: str) -> list[str]:
    """*table* itself, or, partitioned (which takes no storage parameters), its
    partitions; none if it does not exist."""
    cursor.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [table])
    found = cursor.fetchone()
    if found is None:
        return []
    if found[0] != "p":
        return [table]
    cursor.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass(%s) ORDER BY c.relname",
        [table],
    )
    return [name for (name,) in cursor.fetchall()]


def tune(cursor: Any, quote: Any, table: str) -> list[str]:
    """Give *table* (or each of its partitions) the queue's storage parameters; returns
    the tables changed."""
    changed = _targets(cursor, table)
    settings = ", ".join(f"{name} = {value}" for name, value in OPTIONS)
    for name in changed:
        cursor.execute(f"ALTER TABLE {quote(name)} SET ({settings})")
    return changed


def untune(cursor: Any, quote: Any, table: str) -> list[str]:
    """Back to the server's defaults (the migration's reverse)."""
    changed = _targets(cursor, table)
    names = ", ".join(name for name, _ in OPTIONS)
    for name in changed:
        cursor.execute(f"ALTER TABLE {quote(name)} RESET ({names})")
    return changed


def options_of(cursor: Any, table: str) -> dict[str, str]:
    """*table*'s own storage parameters (``pg_class.reloptions``)."""
    cursor.execute("SELECT reloptions FROM pg_class WHERE oid = to_regclass(%s)", [table])
    found = cursor.fetchone()
    pairs = (found[0] if found else None) or []
    return dict(pair.split("=", 1) for pair in pairs)


__all__ = ["OPTIONS", "QUEUE_TABLES", "clause", "options_of", "tune", "untune"]
