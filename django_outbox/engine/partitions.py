"""Time-partitioned tables for the three parts (PostgreSQL, optional).

A part's table can be turned into a table partitioned by range of its creation time
(``created_at``; the inbox's ``received_at``), one partition a day, week or month,
with ``outbox_partition`` (see docs/partitioning.md). Then retention drops a whole
partition once every row in it finished before the cut-off, instead of deleting its
rows one by one, and the sweep creates the partitions of the coming intervals.

What changes with partitioning:

- The primary key becomes ``(id, <time>)`` (PostgreSQL wants the partition key in
  every unique index). Ids still come from one sequence: they stay unique.
- The unique indexes that are not the primary key become plain indexes. For the
  outbox's ``message_id`` and the jobs' ``result_id`` (random UUIDs) and the outbox's
  ``(destination, key, sequence)`` (given out by the key counter) nothing depends on
  them. The inbox's deduplication does: it moves to ``django_outbox_inbox_seen``, a
  narrow table with the unique ``(source, message_id)``, written in the same
  statement as the message (``seen_guard``). The jobs' unique key of active jobs is
  then kept by a transaction-scoped advisory lock on the key (``lock_unique_key``).
- The table at the time of the change becomes the first partition, covering
  everything before the change's cut-over, so no row is copied; a ``DEFAULT``
  partition takes rows no partition covers (the sweep not run for longer than the
  partitions made ahead), so a write never fails for want of a partition.

A table is partitioned when PostgreSQL says so; what interval it uses is written in
the table's comment by ``convert`` and read back from there.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DatabaseError, connections, models, transaction

from django_outbox.engine import faults, vacuum

logger = logging.getLogger("django_outbox.partitions")

INTERVALS = ("day", "week", "month")
#: The table comment ``convert`` writes: how a partitioned table is recognised.
COMMENT = "django_outbox: partitioned by {interval}"
_COMMENT = re.compile(r"^django_outbox: partitioned by (day|week|month)$")
#: How long maintenance waits for the parent's lock before it gives up until the next
#: sweep (others' statements queue behind a waiting DROP: keep it short).
LOCK_TIMEOUT = "2s"


class PartitioningError(Exception):
    """A table cannot be partitioned, or is not partitioned as asked."""


@dataclass(frozen=True)
class Layout:
    """How a partitioned table is cut."""

    table: str
    #: The partition key's column (the creation time).
    column: str
    interval: str


@dataclass(frozen=True)
class Partition:
    name: str
    #: Its range: ``None`` for ``MINVALUE``; both ``None`` for the default partition.
    lower: datetime | None
    upper: datetime | None
    default: bool = False


# -- recognising a partitioned table -------------------------------------------------

_LAYOUTS: dict[tuple[str, str], Layout | None] = {}


def layout(model: type[models.Model], using: str) -> Layout | None:
    """*model*'s table's layout on *using*, or ``None`` if it is not partitioned
    (always ``None`` off PostgreSQL). Read once per process and database."""
    table = model._meta.db_table
    key = (using, table)
    if key in _LAYOUTS:
        return _LAYOUTS[key]
    connection = connections[using]
    found = None
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT c.relkind, obj_description(c.oid, 'pg_class') FROM pg_class c "
                "WHERE c.oid = to_regclass(%s)",
                [connection.ops.quote_name(table)],
            )
            row = cursor.fetchone()
        if row is not None and row[0] == "p":
            match = _COMMENT.match(row[1] or "")
            interval = match.group(1) if match else "day"
            found = Layout(table, _time_column(model), interval)
    _LAYOUTS[key] = found
    return found


def is_partitioned(model: type[models.Model], using: str) -> bool:
    return layout(model, using) is not None


def forget() -> None:
    """Read the layouts again (after ``convert``, and between tests)."""
    _LAYOUTS.clear()


def _time_column(model: type[models.Model]) -> str:
    return column_of(model, "created_at")


def column_of(model: type[models.Model], name: str) -> str:
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field)
    return str(field.column)


# -- intervals -----------------------------------------------------------------------


def floor(instant: datetime, interval: str) -> datetime:
    """The start (UTC) of the interval that holds *instant*."""
    instant = instant.astimezone(UTC)
    day = instant.replace(hour=0, minute=0, second=0, microsecond=0)
    if interval == "day":
        return day
    if interval == "week":
        return day - timedelta(days=day.weekday())
    if interval == "month":
        return day.replace(day=1)
    raise PartitioningError(f"interval must be one of {', '.join(INTERVALS)}, not {interval!r}")


def step(start: datetime, interval: str, count: int = 1) -> datetime:
    """The start of the interval *count* intervals after the one starting at *start*."""
    if interval == "day":
        return start + timedelta(days=count)
    if interval == "week":
        return start + timedelta(weeks=count)
    if interval == "month":
        months = start.year * 12 + start.month - 1 + count
        return start.replace(year=months // 12, month=months % 12 + 1)
    raise PartitioningError(f"interval must be one of {', '.join(INTERVALS)}, not {interval!r}")


def partition_name(table: str, start: datetime, interval: str) -> str:
    stamp = start.strftime("%Y%m" if interval == "month" else "%Y%m%d")
    return f"{table}_p{stamp}"


# -- reading the partitions ----------------------------------------------------------

_BOUND = re.compile(r"FOR VALUES FROM \((.+)\) TO \((.+)\)")


def partitions(model: type[models.Model], using: str) -> list[Partition]:
    """The partitions of *model*'s table, oldest first, the default one last."""
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
            [connection.ops.quote_name(model._meta.db_table)],
        )
        rows = cursor.fetchall()
        found = []
        for name, bound in rows:
            if bound == "DEFAULT":
                found.append(Partition(name, None, None, default=True))
                continue
            match = _BOUND.match(bound)
            if match is None:
                raise PartitioningError(f"{name}: a bound this code does not read: {bound}")
            lower, upper = (_instant(cursor, text) for text in match.groups())
            found.append(Partition(name, lower, upper))
    return sorted(found, key=lambda p: (p.default, p.lower or datetime.min.replace(tzinfo=UTC)))


def _instant(cursor: Any, text: str) -> datetime | None:
    if text == "MINVALUE":
        return None
    if text == "MAXVALUE":
        return datetime.max.replace(tzinfo=UTC)
    cursor.execute(f"SELECT {text}::timestamptz")  # a literal PostgreSQL itself printed
    value: datetime = cursor.fetchone()[0]
    return value.astimezone(UTC)


# -- creating the partitions ahead ---------------------------------------------------


def create_ahead(model: type[models.Model], using: str, ahead: int) -> list[str]:
    """Create the partitions of the current interval and the *ahead* next ones that
    are missing; return their names. A range some rows of the default partition fall
    in is left to the default partition (PostgreSQL would refuse it)."""
    shape = layout(model, using)
    if shape is None:
        return []
    existing = partitions(model, using)
    covered = [(p.lower, p.upper) for p in existing if not p.default]
    start = floor(_database_now(using), shape.interval)
    made = []
    for n in range(ahead + 1):
        lower, upper = step(start, shape.interval, n), step(start, shape.interval, n + 1)
        if any(_overlaps(lower, upper, a, b) for a, b in covered):
            continue
        name = partition_name(shape.table, lower, shape.interval)
        try:
            with transaction.atomic(using=using):
                _set_lock_timeout(using)
                _create_partition(using, model, name, lower, upper)
        except DatabaseError as exc:
            logger.warning("could not create partition %s yet: %s", name, exc)
            continue
        made.append(name)
        covered.append((lower, upper))
    if made:
        logger.info("created partition(s) %s", ", ".join(made))
    return made


def _overlaps(
    lower: datetime, upper: datetime, other_lower: datetime | None, other_upper: datetime | None
) -> bool:
    if other_upper is not None and other_upper <= lower:
        return False
    return other_lower is None or other_lower < upper


def _create_partition(
    using: str, model: type[models.Model], name: str, lower: datetime, upper: datetime
) -> None:
    q = connections[using].ops.quote_name
    table = model._meta.db_table
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE {q(name)} PARTITION OF {q(table)} FOR VALUES FROM (%s) TO (%s)"
            f"{_storage(table)}",
            [lower, upper],
        )


def _storage(table: str) -> str:
    """The ``WITH (…)`` of a new partition of *table*: a queue table's partitions are
    vacuumed by dead rows (``engine.vacuum``), as the plain table is."""
    return f" {vacuum.clause()}" if table in vacuum.QUEUE_TABLES else ""


def _legacy(table: str) -> str:
    return f"{table}_legacy"


def _short(name: str) -> str:
    """PostgreSQL keeps 63 bytes of a name: keep the end, which tells them apart."""
    return name if len(name) <= 63 else name[:30] + name[-33:]


def _database_now(using: str) -> datetime:
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT now()")
        value: datetime = cursor.fetchone()[0]
    return value


def _set_lock_timeout(using: str) -> None:
    with connections[using].cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")


# -- dropping what retention let go ---------------------------------------------------


@dataclass(frozen=True)
class Expiry:
    """What tells a partition's rows may all go: every row in one of *finished*
    states, finished before the cut-off, and none holding back its key."""

    finished: tuple[str, ...]
    #: The states a row can be in that are not finished.
    unfinished: tuple[str, ...]
    blocking: bool
    state_column: str = "state"
    finished_column: str = "finished_at"


def drop_expired(
    model: type[models.Model], using: str, expiry: Expiry, cutoff: datetime
) -> list[Partition]:
    """Drop the partitions (not the default one) whose every row finished before
    *cutoff*; return them. Each is checked, then locked (the parent, for at most
    ``LOCK_TIMEOUT``), checked again and dropped; one that cannot be locked now is
    left for the next sweep."""
    shape = layout(model, using)
    if shape is None:
        return []
    dropped = []
    for partition in partitions(model, using):
        if partition.default or partition.upper is None or partition.upper > cutoff:
            continue
        if not _all_expired(using, partition.name, expiry, cutoff):
            continue
        try:
            with transaction.atomic(using=using):
                _set_lock_timeout(using)
                q = connections[using].ops.quote_name
                with connections[using].cursor() as cursor:
                    cursor.execute(f"LOCK TABLE {q(shape.table)} IN ACCESS EXCLUSIVE MODE")
                    if not _all_expired(using, partition.name, expiry, cutoff):
                        continue
                    cursor.execute(f"DROP TABLE {q(partition.name)}")
        except DatabaseError as exc:
            logger.warning("could not drop partition %s now: %s", partition.name, exc)
            continue
        logger.info("dropped partition %s (every row finished before %s)", partition.name, cutoff)
        dropped.append(partition)
    return dropped


def _all_expired(using: str, name: str, expiry: Expiry, cutoff: datetime) -> bool:
    """Whether every row of partition *name* finished before *cutoff*: one probe per
    unfinished state, one for rows finished since, one for rows holding their key,
    each answered by the partition's partial indexes."""
    q = connections[using].ops.quote_name
    state, finished_at = q(expiry.state_column), q(expiry.finished_column)
    probes: list[tuple[str, list[Any]]] = [
        (f"SELECT 1 FROM {q(name)} WHERE {state} = %s LIMIT 1", [value])
        for value in expiry.unfinished
    ]
    probes += [
        (
            f"SELECT 1 FROM {q(name)} WHERE {state} = %s AND {finished_at} >= %s LIMIT 1",
            [value, cutoff],
        )
        for value in expiry.finished
    ]
    if expiry.blocking:
        probes.append((f"SELECT 1 FROM {q(name)} WHERE blocking LIMIT 1", []))
    with connections[using].cursor() as cursor:
        for sql, params in probes:
            cursor.execute(sql, params)
            if cursor.fetchone() is not None:
                return False
    return True


def oldest_kept(model: type[models.Model], using: str) -> datetime | None:
    """The earliest creation time a row of *model*'s partitioned table can still have:
    the lower bound of its oldest partition, or its default partition's oldest row if
    that is earlier. ``None``: no bound (the first partition reaches back for ever)."""
    shape = layout(model, using)
    if shape is None:
        return None
    found = partitions(model, using)
    bounded = [p for p in found if not p.default]
    if not bounded or bounded[0].lower is None:
        return None
    oldest = bounded[0].lower
    q = connections[using].ops.quote_name
    for partition in found:
        if partition.default:
            with connections[using].cursor() as cursor:
                cursor.execute(f"SELECT min({q(shape.column)}) FROM {q(partition.name)}")
                earliest = cursor.fetchone()[0]
            if earliest is not None and earliest < oldest:
                oldest = earliest
    return oldest


# -- turning a table into a partitioned one ------------------------------------------


@dataclass
class Conversion:
    """What ``convert`` did."""

    table: str
    interval: str
    #: The first partition (the table as it was) holds everything before this.
    cutover: datetime
    created: list[str]
    rows: int
    seen: int = 0


def convert(
    model: type[models.Model],
    using: str,
    interval: str,
    *,
    ahead: int,
    seen_model: type[models.Model] | None = None,
    cutover: datetime | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> Conversion:
    """Turn *model*'s table into a table partitioned by *interval* of its creation time.

    First, without blocking writers: the indexes the partitioned table needs that the
    table lacks are built ``CONCURRENTLY`` (the primary key with the time, a plain
    twin of each unique index), the table gets a checked constraint that its rows are
    older than the cut-over (the start of the interval after next), and the inbox's
    ``seen`` table is filled from it. Then, in one transaction holding the table's
    lock for a moment (no row is read or copied): the table is renamed ``…_legacy``,
    the partitioned table is created under the old name with the same columns,
    defaults, checks, identity and indexes, the old table is attached as its first
    partition (``MINVALUE`` to the cut-over), and the default partition and the
    partitions up to *ahead* intervals after the current one are created.

    *cutover* (an interval's start) replaces the default cut-over: an earlier one, for a
    table whose rows are all older (a new one, empty), leaves less to the first
    partition; the constraint's check refuses one that some row is not older than.
    """
    connection = connections[using]
    if connection.vendor != "postgresql":
        raise PartitioningError("partitioned tables need PostgreSQL")
    if interval not in INTERVALS:
        raise PartitioningError(f"interval must be one of {', '.join(INTERVALS)}")
    if connection.in_atomic_block:
        raise PartitioningError("convert() builds indexes concurrently: not in a transaction")
    forget()
    table = model._meta.db_table
    if layout(model, using) is not None:
        raise PartitioningError(f"{table} is partitioned already")
    q = connection.ops.quote_name
    column = _time_column(model)
    pk = str(model._meta.pk.column)
    legacy = _legacy(table)
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [q(legacy)])
        if cursor.fetchone()[0] is not None:
            raise PartitioningError(f"{legacy} exists: an earlier conversion was not finished")
        now = floor(_database_now(using), interval)
        if cutover is None:
            cutover = step(now, interval, 2)
        elif floor(cutover, interval) != cutover:
            raise PartitioningError(f"the cut-over must start an interval: {cutover}")
        # 1. Without blocking writers.
        say(f"{table}: building the indexes the partitioned table needs (concurrently)")
        key_index = _short(f"{table}_{pk}_{column}_key")
        # An index build that failed part way (a conversion stopped by an error or a
        # cancel) leaves an invalid index that IF NOT EXISTS would take as built.
        for name in _invalid_indexes(cursor, table):
            if name == key_index or name.endswith("_plain"):
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(name)}")
        cursor.execute(
            f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {q(key_index)} "
            f"ON {q(table)} ({q(pk)}, {q(column)})"
        )
        for name, definition, unique, primary in _indexes(cursor, table):
            if not unique or primary or name == key_index or name.endswith("_plain"):
                continue
            twin = _short(f"{name}_plain")
            cursor.execute(_rewrite(definition, name, twin, table, unique=False, concurrently=True))
        bound = _short(f"{table}_before_cutover")
        # A conversion stopped after this step left its constraint, maybe with another
        # cut-over: this run's takes its place.
        cursor.execute(f"ALTER TABLE {q(table)} DROP CONSTRAINT IF EXISTS {q(bound)}")
        cursor.execute(
            f"ALTER TABLE {q(table)} ADD CONSTRAINT {q(bound)} "
            f"CHECK ({q(column)} IS NOT NULL AND {q(column)} < %s) NOT VALID",
            [cutover],
        )
        say(f"{table}: checking every row is older than {cutover:%Y-%m-%d %H:%M} UTC")
        cursor.execute(f"ALTER TABLE {q(table)} VALIDATE CONSTRAINT {q(bound)}")
        seen = 0
        watermark = 0
        if seen_model is not None:
            say(f"{table}: remembering every stored message id in {seen_model._meta.db_table}")
            seen, watermark = _fill_seen(cursor, q, model, seen_model, after=0)
    faults.point("partitions.before_swap")
    # 2. The swap, in one short transaction.
    created = []
    with transaction.atomic(using=using), connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '30s'")
        cursor.execute(f"LOCK TABLE {q(table)} IN ACCESS EXCLUSIVE MODE")
        if seen_model is not None:
            more, _ = _fill_seen(cursor, q, model, seen_model, after=watermark)
            seen += more
        cursor.execute(f"SELECT count(*) FROM {q(table)}")  # for the report; an index scan
        rows = cursor.fetchone()[0]
        indexes = _indexes(cursor, table)
        cursor.execute(f"ALTER TABLE {q(table)} RENAME TO {q(legacy)}")
        cursor.execute(
            "SELECT pg_get_serial_sequence(%s, %s)", [q(legacy), pk]
        )  # the identity's sequence: its name would clash with the new table's
        sequence = cursor.fetchone()[0]
        for name, _definition, _unique, _primary in indexes:
            cursor.execute(f"ALTER INDEX {q(name)} RENAME TO {q(_short(name + '_legacy'))}")
        cursor.execute(
            f"CREATE TABLE {q(table)} (LIKE {q(legacy)} INCLUDING DEFAULTS "
            f"INCLUDING CONSTRAINTS INCLUDING IDENTITY INCLUDING STORAGE) "
            f"PARTITION BY RANGE ({q(column)})"
        )
        cursor.execute(f"ALTER TABLE {q(table)} DROP CONSTRAINT {q(bound)}")
        if sequence is not None:
            cursor.execute(
                "SELECT setval(pg_get_serial_sequence(%s, %s), "
                f"GREATEST((SELECT last_value FROM {sequence}), "
                f"(SELECT coalesce(max({q(pk)}), 1) FROM {q(legacy)})))",
                [q(table), pk],
            )
        cursor.execute(
            f"ALTER TABLE {q(table)} ADD CONSTRAINT {q(_short(table + '_pkey'))} "
            f"PRIMARY KEY ({q(pk)}, {q(column)})"
        )
        for name, definition, _unique, primary in indexes:
            if primary or name == key_index or name.endswith("_plain"):
                continue
            cursor.execute(
                _rewrite(definition, name, name, table, unique=False, concurrently=False)
            )
        # The old primary key gives way to the index built beforehand, which the new
        # primary key then takes over as is (a plain unique index would be built again).
        for constraint in _primary_key(cursor, legacy):
            cursor.execute(f"ALTER TABLE {q(legacy)} DROP CONSTRAINT {q(constraint)}")
        cursor.execute(
            f"ALTER TABLE {q(legacy)} ADD CONSTRAINT {q(_short(legacy + '_pkey'))} "
            f"PRIMARY KEY USING INDEX {q(_short(key_index + '_legacy'))}"
        )
        cursor.execute(f"COMMENT ON TABLE {q(table)} IS %s", [COMMENT.format(interval=interval)])
        cursor.execute(
            f"ALTER TABLE {q(table)} ATTACH PARTITION {q(legacy)} "
            f"FOR VALUES FROM (MINVALUE) TO (%s)",
            [cutover],
        )
        default = _short(f"{table}_default")
        cursor.execute(
            f"CREATE TABLE {q(default)} PARTITION OF {q(table)} DEFAULT{_storage(table)}"
        )
        last = max(step(now, interval, ahead + 1), step(cutover, interval, 1))
        lower = cutover
        while lower < last:
            upper = step(lower, interval)
            name = partition_name(table, lower, interval)
            cursor.execute(
                f"CREATE TABLE {q(name)} PARTITION OF {q(table)} FOR VALUES FROM (%s) TO (%s)"
                f"{_storage(table)}",
                [lower, upper],
            )
            created.append(name)
            lower = upper
    forget()
    return Conversion(table, interval, cutover, created, rows, seen)


def _indexes(cursor: Any, table: str) -> list[tuple[str, str, bool, bool]]:
    """*table*'s indexes: name, definition, unique, primary."""
    cursor.execute(
        "SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisunique, i.indisprimary "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = to_regclass(%s) ORDER BY c.relname",
        [_quote(table)],
    )
    return [tuple(row) for row in cursor.fetchall()]


def _primary_key(cursor: Any, table: str) -> list[str]:
    cursor.execute(
        "SELECT conname FROM pg_constraint WHERE contype = 'p' AND conrelid = to_regclass(%s)",
        [_quote(table)],
    )
    return [row[0] for row in cursor.fetchall()]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_INDEX_HEAD = re.compile(r"^CREATE (UNIQUE )?INDEX (\S+) ON (?:ONLY )?(\S+) ")


def _invalid_indexes(cursor: Any, table: str) -> list[str]:
    cursor.execute(
        "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
        "WHERE x.indrelid = to_regclass(%s) AND NOT x.indisvalid",
        [_quote(table)],
    )
    return [row[0] for row in cursor.fetchall()]


def _rewrite(
    definition: str, name: str, new_name: str, table: str, *, unique: bool, concurrently: bool
) -> str:
    """*definition* (``pg_get_indexdef``) as an index named *new_name* on *table*."""
    match = _INDEX_HEAD.match(definition)
    if match is None:
        raise PartitioningError(f"an index definition this code does not read: {definition}")
    head = "CREATE UNIQUE INDEX" if unique else "CREATE INDEX"
    if concurrently:
        head += " CONCURRENTLY IF NOT EXISTS"
    quoted = _quote
    return f"{head} {quoted(new_name)} ON {quoted(table)} {definition[match.end() :]}"


def _fill_seen(
    cursor: Any,
    q: Callable[[str], str],
    model: type[models.Model],
    seen_model: type[models.Model],
    *,
    after: int,
) -> tuple[int, int]:
    """Copy *model*'s ``(source, message_id, time)`` into the seen table, in chunks of
    ids after *after*; return how many were new and the last id copied."""
    table, seen = model._meta.db_table, seen_model._meta.db_table
    pk, column = str(model._meta.pk.column), _time_column(model)
    copied = 0
    last = after
    while True:
        cursor.execute(
            f"WITH chunk AS (SELECT {q(pk)}, source, message_id, {q(column)} FROM {q(table)} "
            f"WHERE {q(pk)} > %s ORDER BY {q(pk)} LIMIT 50000), "
            f"added AS (INSERT INTO {q(seen)} (source, message_id, received_at) "
            f"SELECT source, message_id, {q(column)} FROM chunk ON CONFLICT DO NOTHING "
            f"RETURNING 1) SELECT (SELECT max({q(pk)}) FROM chunk), (SELECT count(*) FROM added)",
            [last],
        )
        top, added = cursor.fetchone()
        if top is None:
            return copied, last
        copied += added
        last = top


# -- the unique keys partitioning cannot index ---------------------------------------


@dataclass(frozen=True)
class Guard:
    """``fast_insert``'s guard of a partitioned inbox: the seen table's row is
    inserted first, in the same statement, and the message only if that was new."""

    table: str
    #: The guarded fields (the seen table's columns have the same names).
    fields: tuple[str, ...]
    #: The seen table's time column, and the row's field whose value it takes.
    time_column: str


def claim_seen(seen_model: type[models.Model], using: str, source: str, message_id: str) -> bool:
    """Record (*source*, *message_id*) as seen; ``False`` if it was already. A
    concurrent transaction's claim of the same id is waited for (the unique index)."""
    q = connections[using].ops.quote_name
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {q(seen_model._meta.db_table)} (source, message_id, received_at) "
            "VALUES (%s, %s, now()) ON CONFLICT DO NOTHING RETURNING 1",
            [source, message_id],
        )
        return cursor.fetchone() is not None


def forget_seen(seen_model: type[models.Model], using: str, source: str, message_id: str) -> bool:
    """Delete (*source*, *message_id*) from the seen table; whether it was there."""
    q = connections[using].ops.quote_name
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {q(seen_model._meta.db_table)} WHERE source = %s AND message_id = %s",
            [source, message_id],
        )
        return bool(cursor.rowcount)


def lock_unique_key(using: str, key: str) -> None:
    """Hold a lock on job unique key *key* until the transaction ends (a partitioned
    jobs table has no unique index of active keys: this takes its place)."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            ["django_outbox.unique_key:" + key],
        )


def purge_seen(
    model: type[models.Model], seen_model: type[models.Model], using: str, batch_size: int
) -> int:
    """Delete the seen rows older than every message the inbox still holds, in batches."""
    bound = oldest_kept(model, using)
    if bound is None:
        return 0
    # A day's margin: an id claimed (claim_seen) in a statement before its message's
    # INSERT carries a slightly earlier time than the message.
    bound -= timedelta(days=1)
    q = connections[using].ops.quote_name
    table = q(seen_model._meta.db_table)
    deleted = 0
    with connections[using].cursor() as cursor:
        while True:
            cursor.execute(
                f"DELETE FROM {table} WHERE (source, message_id) IN (SELECT source, message_id "
                f"FROM {table} WHERE received_at < %s LIMIT %s)",
                [bound, batch_size],
            )
            count = int(cursor.rowcount)
            deleted += count
            if count < batch_size:
                return deleted
