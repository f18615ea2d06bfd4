"""Claiming rows under a lease, declaring the starts of attempts, writing with fencing.

A lease is written with the database's clock (``locked_until = now() +
LEASE_SECONDS``) and carries a fresh token; every write of an outcome matches
on that token, and a rescue clears it, so a holder whose lease was taken over
changes nothing. The claimer's worker id (``claimed_by``) lets a dead
worker's rows be rescued as soon as its heartbeat stops.

A claim is not an attempt. Just before a step starts on rows, :func:`declare`
counts the attempt (``attempts + 1``), stamps when it started and sets
``attempt_open``, in one statement fenced by the lease token: rows whose lease
was taken over or handed back are not declared, and the step leaves them
alone. A worker that dies before reaching a row leaves it undeclared, and the
rescue gives it back uncounted; one that dies during a step leaves its rows
declared, and the rescue records that attempt as ended uncleanly.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import models, transaction
from django.db.models import Case, Expression, F, Value, When
from django.utils import timezone

from django_outbox.engine import clock
from django_outbox.engine.fields import KeptJSONField
from django_outbox.engine.rows import builds_directly, fast_timestamps, instance_builder

M = TypeVar("M", bound=models.Model)

#: Rows per UPDATE when outcomes differ row by row: a bounded statement (about
#: a dozen parameters a row) whatever BATCH_SIZE is.
UPDATE_CHUNK = 1000


@dataclass(frozen=True)
class Lease:
    """A claim on rows for ``seconds``; ``token`` fences late writers out."""

    token: uuid.UUID
    seconds: float
    #: The claiming worker (``None`` for a process without a heartbeat).
    worker: uuid.UUID | None = None
    #: ``time.monotonic()`` when it was taken: local budgets only, never stored.
    taken: float = dataclasses.field(default_factory=time.monotonic)

    @classmethod
    def new(cls, seconds: float, worker: uuid.UUID | None = None) -> Lease:
        """A fresh lease lasting *seconds*, held by *worker*."""
        return cls(token=uuid.uuid4(), seconds=seconds, worker=worker)

    def deadline(self, margin: float = 0.2) -> float:
        """Monotonic time after which no new step should start: the lease's end less
        *margin* (a fraction of its length) kept for recording the outcomes."""
        return self.taken + self.seconds * (1 - margin)


def claim(
    queryset: models.QuerySet[M],
    *,
    lease: Lease,
    limit: int,
    running_state: str,
    fields: Sequence[str] | None = None,
    now: clock.Instant | None = None,
) -> list[M]:
    """Claim up to *limit* rows of *queryset* under *lease* and return them.

    Rows locked by another claimer are skipped (``FOR UPDATE SKIP LOCKED``
    where the database has it). The UPDATE re-applies *queryset*'s filter, so
    on databases without row locks (SQLite, which serialises writers) a row
    that stopped matching is not taken. The attempt is not counted here but
    when the step starts on the row (:func:`declare`). *fields* limits the
    columns read back (the rest are deferred; the lease fields are always set).
    Runs its own transaction where it needs one.
    """
    connection = transaction.get_connection(queryset.db)
    if connection.vendor == "postgresql":
        statement = ClaimStatement.prepare(
            queryset,
            seconds=lease.seconds,
            limit=limit,
            running_state=running_state,
            fields=fields,
            now=now,
        )
        return statement.run(lease)
    until = clock.later(now if now is not None else clock.now(), lease.seconds)
    with transaction.atomic(using=queryset.db):
        return _claim_select_then_update(
            queryset,
            lease=lease,
            until=until,
            limit=limit,
            running_state=running_state,
            fields=fields,
        )


def _claim_select_then_update(
    queryset: models.QuerySet[M],
    *,
    lease: Lease,
    until: clock.Instant,
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
        locked_until=until,
        lock_token=lease.token,
        claimed_by=lease.worker,
    )
    if updated != len(rows):
        # Another writer got some rows between our SELECT and UPDATE (only
        # possible without row locks): keep exactly what carries our token.
        return list(
            model._default_manager.using(queryset.db).filter(pk__in=ids, lock_token=lease.token)
        )
    for row in rows:
        row.state = running_state  # type: ignore[attr-defined]
        row.lock_token = lease.token  # type: ignore[attr-defined]
        row.claimed_by = lease.worker  # type: ignore[attr-defined]
    return rows


class _Placeholder(list):  # type: ignore[type-arg]
    """A parameter filled in per execution of a prepared claim (compared by identity)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


#: The columns a prepared claim sets to values its ``run`` knows (``locked_until`` is
#: the database's time: read back).
_SET_BY_CLAIM = frozenset({"state", "lock_token", "claimed_by"})

#: Stand-ins for what changes between executions of one prepared claim.
IDS = _Placeholder("ids")
_TOKEN = _Placeholder("token")
_WORKER = _Placeholder("worker")


@dataclass(frozen=True)
class ClaimStatement:
    """PostgreSQL: a claim compiled once into one ``UPDATE … RETURNING``, run many times.

    One round trip, no transaction around it and no list of ids on the wire:
    at 500 rows a batch the separate SELECT and ``id IN (…)`` UPDATE cost as
    much as the publish. ``FOR UPDATE SKIP LOCKED`` applies to the subquery's
    own table only (the filter's EXISTS sublinks lock nothing). Building and
    compiling the queryset costs about a millisecond of Python, as much as
    the statement itself when little is due: a runner keeps its statements.

    The ids go through ``= ANY(ARRAY(…))`` rather than ``IN (…)``: the planner
    then looks the claimed rows up by primary key, where with ``IN`` it
    estimated a hash join over a sequential scan of the whole table cheaper
    below a few hundred thousand rows (a claim that grew with the backlog).
    """

    model: type[models.Model]
    using: str
    sql: str
    params: tuple[Any, ...]
    fields: tuple[Any, ...]
    running_state: str

    @classmethod
    def prepare(
        cls,
        queryset: models.QuerySet[Any],
        *,
        seconds: float,
        limit: int,
        running_state: str,
        fields: Sequence[str] | None = None,
        now: clock.Instant | None = None,
    ) -> ClaimStatement:
        """Compile the claim of up to *limit* rows of *queryset* for leases of *seconds*.

        *queryset* may be narrowed with ``with_ids(queryset, IDS)``: the ids
        are then given to each ``run``.
        """
        model = queryset.model
        connection = transaction.get_connection(queryset.db)
        q = connection.ops.quote_name
        meta = model._meta
        subquery = queryset.values("pk")[:limit].query
        select_sql, select_params = subquery.get_compiler(using=queryset.db).as_sql()
        # In the model's field order: Model.from_db() reads deferred rows positionally.
        # The columns the claim sets are not read back: ``run`` knows their values.
        wanted = tuple(
            f
            for f in meta.concrete_fields
            if (fields is None or f.attname in fields) and f.attname not in _SET_BY_CLAIM
        )
        columns = ", ".join(q(f.column) for f in wanted)
        until = clock.later(now if now is not None else clock.now(), seconds)
        until_sql, until_params = clock.sql_for(until, queryset)
        sql = (
            f"UPDATE {q(meta.db_table)} SET {q('state')} = %s, "
            f"{q('locked_until')} = {until_sql}, {q('lock_token')} = %s, "
            f"{q('claimed_by')} = %s "
            f"WHERE {q(meta.pk.column)} = ANY(ARRAY({select_sql} FOR UPDATE SKIP LOCKED)) "
            f"RETURNING {columns}"
        )
        params = (running_state, *until_params, _TOKEN, _WORKER, *select_params)
        return cls(model, queryset.db, sql, params, wanted, running_state)

    def parameters(self, lease: Lease, ids: Sequence[Any] | None = None) -> list[Any]:
        """The statement's parameters for a claim under *lease* (of *ids*)."""
        fill = {id(_TOKEN): lease.token, id(_WORKER): lease.worker, id(IDS): id_array(ids or ())}
        return [fill.get(id(p), p) for p in self.params]

    def run(self, lease: Lease, ids: Sequence[Any] | None = None) -> list[Any]:
        """Claim under *lease* (restricted to *ids* if prepared with ``IDS``)."""
        params = self.parameters(lease, ids)
        connection = transaction.get_connection(self.using)
        with connection.cursor() as cursor:
            fast_timestamps(cursor, connection)
            cursor.execute(self.sql, params)
            records = cursor.fetchall()
        names = [f.attname for f in self.fields]
        # Per converted field: its index, whether it is JSON, the attribute keeping its
        # JSON text for a ``KeptJSONField`` (a transport sends it as stored), and
        # whether ``json.loads`` alone decodes it (Django's ``from_db_value`` with no
        # decoder of its own).
        converters = [
            (
                i,
                f,
                isinstance(f, models.JSONField),
                f"{f.attname}_json" if isinstance(f, KeptJSONField) else None,
                isinstance(f, models.JSONField) and f.decoder is None,
            )
            for i, f in enumerate(self.fields)
            if hasattr(f, "from_db_value")
        ]
        # A kept field is left as its text, decoded when read, unless a receiver of
        # the model's init signals could see the instance before the text is set:
        # then it is decoded here like any other.
        direct = builds_directly(self.model, names)
        undecoded = (
            [f.attname for f in self.fields if isinstance(f, KeptJSONField)] if direct else []
        )
        build = instance_builder(self.model, self.using, names, direct=direct)
        loads = json.loads
        rows = []
        for record in records:
            values = list(record)
            raw = {}
            for i, field, is_json, kept, plain_json in converters:
                value = values[i]
                if is_json:
                    if kept is not None:
                        raw[kept] = value
                        if undecoded:
                            continue  # taken out of the instance below
                    if value is None:
                        continue  # SQL NULL
                    if value == "{}":  # most headers and keyword arguments
                        values[i] = {}
                        continue
                    if value == "[]":  # most arguments, errors and workers
                        values[i] = []
                        continue
                    if plain_json and type(value) is str:
                        try:
                            values[i] = loads(value)
                        except json.JSONDecodeError:  # as Django's: the text as it is
                            values[i] = value
                        continue
                values[i] = field.from_db_value(value, None, connection)
            row = build(values)
            data = row.__dict__
            data.update(
                raw, state=self.running_state, lock_token=lease.token, claimed_by=lease.worker
            )
            for name in undecoded:
                del data[name]
            rows.append(row)
        return rows


@dataclass(frozen=True, slots=True)
class Declared:
    """Attempts declared started: which rows (by primary key) and when (the database's
    clock). Empty when the lease is no longer this worker's: start nothing."""

    ids: frozenset[Any]
    at: Any = None


#: PostgreSQL declarations compiled once per (model, database).
_DECLARE_SQL: dict[tuple[type[models.Model], str, bool], str] = {}


def declare(
    model: type[models.Model],
    ids: Sequence[Any],
    lease: Lease,
    *,
    running_state: str,
    using: str,
    open_ids: Sequence[Any] | str = (),
) -> Declared:
    """Record that a step starts on the rows *ids* held under *lease*, once, durably,
    before it starts: a worker that dies later is known to have started them.

    A worker with a heartbeat writes its own worker row: the lease's token and every id
    it has started and not recorded yet (*open_ids*, *ids* among them): one small write
    for a window of starts (on PostgreSQL sent without waiting, see
    ``engine.declarations``). The write is fenced: if the lease is no longer held,
    nothing is declared and nothing may start. A process without a heartbeat (a script,
    a test) declares nothing: its claims carry no worker, and if it dies, the rescue
    counts every row it held as started (it cannot tell). The attempt itself is counted
    when its outcome is recorded, or by the rescue."""
    if not ids:
        return Declared(frozenset())
    if lease.worker is None:
        return Declared(frozenset(ids), timezone.now())
    if pipelined(using):
        return declare_pipelined(model, ids, lease, running_state, using, open_ids or ids)
    return _declare_on_worker(model, ids, lease, running_state, using, open_ids or ids)


def pipelined(using: str) -> bool:
    """Whether a worker with a heartbeat declares its starts without waiting (PostgreSQL,
    ``engine.declarations``): then a start costs no round trip, and is declared alone."""
    return bool(transaction.get_connection(using).vendor == "postgresql")


def declare_pipelined(
    model: type[models.Model],
    ids: Sequence[Any],
    lease: Lease,
    running_state: str,
    using: str,
    open_ids: Sequence[Any] | str,
    pipe: Any = None,
) -> Declared:
    """Send the declaration on *pipe* (default: this thread's pipeline to *using*)."""
    from django_outbox.engine import declarations

    assert lease.worker is not None
    try:
        pipe = pipe or declarations.pipeline(using)
        if lease.token in pipe.lost:
            return Declared(frozenset())
        pipe.declare(
            model._meta.db_table,
            model._meta.pk.column,
            ids,
            open_ids if isinstance(open_ids, str) else encode_ids(open_ids),
            lease.token,
            lease.worker,
            running_state,
        )
    except Exception:
        declarations.forget(using)
        raise
    # The start by this host's clock (the database's arrives with the answer, later).
    return Declared(frozenset(ids), timezone.now())


def _declare_on_worker(
    model: type[models.Model],
    ids: Sequence[Any],
    lease: Lease,
    running_state: str,
    using: str,
    open_ids: Sequence[Any] | str,
) -> Declared:
    from django_outbox.engine.models import Worker

    connection = transaction.get_connection(using)
    listed = open_ids if isinstance(open_ids, str) else encode_ids(open_ids)
    if connection.vendor == "postgresql":
        key = (model, using, True)
        sql = _DECLARE_SQL.get(key)
        if sql is None:
            q = connection.ops.quote_name
            sql = _DECLARE_SQL[key] = (
                f"UPDATE {q(Worker._meta.db_table)} SET {q('attempt_token')} = %s, "
                f"{q('attempt_ids')} = %s, {q('attempt_started_at')} = STATEMENT_TIMESTAMP() "
                f"WHERE {q('id')} = %s AND EXISTS (SELECT 1 FROM {q(model._meta.db_table)} "
                f"WHERE {q(model._meta.pk.column)} = ANY(%s) AND {q('lock_token')} = %s "
                f"AND {q('state')} = %s) "
                f"RETURNING {q('attempt_started_at')}"
            )
        with connection.cursor() as cursor:
            # Looked up by primary key: a row still held means the lease is (a lease is
            # taken over whole; rows handed back never reach here).
            cursor.execute(
                sql, [lease.token, listed, lease.worker, [ids[0]], lease.token, running_state]
            )
            record = cursor.fetchone()
        return Declared(frozenset(ids), record[0]) if record else Declared(frozenset())
    held = with_ids(fenced(model, lease, running_state, using), ids[:1])
    now = timezone.now()
    assert lease.worker is not None
    updated = (
        Worker.objects.using(using)
        .filter(pk=lease.worker)
        .filter(models.Exists(held))
        .update(attempt_token=lease.token, attempt_ids=listed, attempt_started_at=now)
    )
    return Declared(frozenset(ids), now) if updated else Declared(frozenset())


def declared_started(using: str, rows: Sequence[Any]) -> set[Any]:
    """Which of *rows* (held under a lease, read with their ``lock_token`` and
    ``claimed_by``) had their attempt started: marked ``attempt_open``, claimed by a
    process without a heartbeat, or named by their worker's row under the same lease."""
    from django_outbox.engine.models import Worker

    # Marked started (a lock-mode claim), or claimed by a process without a heartbeat,
    # which declares nothing: counted as started, since nobody can tell.
    started = {
        row.pk for row in rows if getattr(row, "attempt_open", False) or row.claimed_by is None
    }
    workers = {row.claimed_by for row in rows if row.claimed_by is not None}
    if not workers:
        return started
    named: dict[tuple[Any, Any], set[str]] = {}
    for worker, token, listed in (
        Worker.objects.using(using)
        .filter(pk__in=workers)
        .values_list("pk", "attempt_token", "attempt_ids")
    ):
        if token is not None and listed:
            named[(worker, token)] = decode_ids(listed)
    for row in rows:
        if str(row.pk) in named.get((row.claimed_by, row.lock_token), ()):
            started.add(row.pk)
    return started


class IdRuns:
    """The ids of the attempts a batch has started and not recorded, written out as
    runs of consecutive integers (``encode_ids``). Adding and removing cost a set's
    operations: a batch records its groups by the hundred."""

    def __init__(self) -> None:
        self.ids: set[Any] = set()

    def __bool__(self) -> bool:
        return bool(self.ids)

    def add(self, pk: Any) -> None:
        self.ids.add(pk)

    def remove(self, ids: Sequence[Any]) -> None:
        self.ids.difference_update(ids)

    def text(self) -> str:
        try:
            ordered = sorted(self.ids)
        except TypeError:  # keys that do not order: as they come
            ordered = list(self.ids)
        return encode_ids(ordered)


def encode_ids(ids: Sequence[Any]) -> str:
    """Primary keys as text, runs of consecutive integers as ``first-last``: a batch's
    ids are mostly one run (``"4501-4700,4702"``), so the worker row stays small."""
    parts: list[str] = []
    run: list[int] = []
    for pk in ids:
        if isinstance(pk, int) and not isinstance(pk, bool):
            if run and pk == run[-1] + 1:
                run.append(pk)
                continue
            _close_run(parts, run)
            run = [pk]
            continue
        _close_run(parts, run)
        run = []
        parts.append(str(pk))
    _close_run(parts, run)
    return ",".join(parts)


def _close_run(parts: list[str], run: list[int]) -> None:
    if len(run) > 1:
        parts.append(f"{run[0]}-{run[-1]}")
    elif run:
        parts.append(str(run[0]))


def decode_ids(text: str) -> set[str]:
    """The primary keys (as text) that ``encode_ids`` wrote."""
    found: set[str] = set()
    for part in text.split(","):
        first, dash, last = part.partition("-")
        if dash and first.isdigit() and last.isdigit():
            found.update(str(n) for n in range(int(first), int(last) + 1))
        elif part:
            found.add(part)
    return found


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
    # ``IDS`` stays itself: a prepared claim fills it in per run.
    where = f"{column} = ANY(%s{array_cast(meta.pk, connection)})"
    return queryset.extra(where=[where], params=[ids if ids is IDS else id_array(ids)])


def array_cast(pk: Any, connection: Any) -> str:
    """The cast that makes an ``id_array`` parameter an array of *pk*'s column type."""
    return f"::{pk.db_type(connection)}[]"


def id_array(ids: Sequence[Any]) -> Any:
    """Primary keys *ids* as one PostgreSQL array parameter (see ``array_cast``): for
    integer and UUID keys, the array's text (``{1,2,3}``), which psycopg passes as one
    string. Django's cursors bind parameters on the client, where psycopg quotes a list
    element by element in Python: 500 ids cost more than the UPDATE they select (a
    profile of the jobs' record). Any other key goes as a list."""
    kinds = {type(pk) for pk in ids}
    if kinds <= _ARRAY_TEXT_TYPES:
        return "{" + ",".join(map(str, ids)) + "}"
    return list(ids)


#: Key types whose ``str()`` is their PostgreSQL array element as it is.
_ARRAY_TEXT_TYPES = {int, uuid.UUID}


def fenced(model: type[M], lease: Lease, running_state: str, using: str) -> models.QuerySet[M]:
    """Rows still held under *lease*: the only ones its holder may change.

    Once a sweep recovers an expired lease it clears the token, so a late
    writer's UPDATE through this queryset matches nothing.
    """
    return model._default_manager.using(using).filter(lock_token=lease.token, state=running_state)


@dataclass(frozen=True, slots=True)
class FencedRows:
    """The rows still held under a lease, as ``fenced`` selects them, without building
    the queryset until a statement needs the ORM.

    On PostgreSQL the UPDATE that records a group's shared values (every row of a batch
    that finished alike) is compiled once per shape of values and run with fresh
    parameters (``update``). A profile of ``outbox_relay`` at a steady 300 items/s, a
    few rows a wake, found recording at 47 % of its CPU, most of it Django building,
    resolving and compiling the same UPDATE (and the fence's queryset) every time.
    """

    model: type[models.Model]
    token: uuid.UUID
    running_state: str
    using: str

    @classmethod
    def of(cls, model: type[models.Model], lease: Lease, running_state: str, using: str) -> Any:
        return cls(model, lease.token, running_state, using)

    @property
    def db(self) -> str:
        return self.using

    def queryset(self) -> models.QuerySet[Any]:
        return self.model._default_manager.using(self.using).filter(
            lock_token=self.token, state=self.running_state
        )

    def update(self, ids: Sequence[Any], values: Mapping[str, Any]) -> int:
        """Set *values* on the rows *ids* still held; returns how many were changed."""
        statement = _record_statement(self.model, self.using, values)
        if statement is None:
            return with_ids(self.queryset(), ids).update(**values)
        return statement.run(self, ids, values)


@dataclass(frozen=True, slots=True)
class _RecordStatement:
    """``UPDATE … SET … WHERE lock_token = %s AND state = %s AND pk = ANY(%s)``,
    compiled for one shape of values: which fields, in which order, and the SQL of each
    expression among them (an expression is part of the shape, a plain value is not)."""

    sql: str
    #: Per value, in order: its field (a plain value, prepared per run), or the
    #: compiled parameters of its expression.
    slots: tuple[tuple[Any, tuple[Any, ...] | None], ...]
    token_field: Any

    def run(self, rows: FencedRows, ids: Sequence[Any], values: Mapping[str, Any]) -> int:
        connection = transaction.get_connection(rows.using)
        params: list[Any] = []
        for (field, compiled), value in zip(self.slots, values.values(), strict=True):
            if compiled is not None:
                params.extend(compiled)
            else:
                if type(value) is Value:
                    value = value.value  # a value of the field's type (``_plain_value``)
                params.append(field.get_db_prep_save(value, connection=connection))
        params.append(self.token_field.get_db_prep_value(rows.token, connection))
        params.append(rows.running_state)
        params.append(id_array(ids))
        with connection.cursor() as cursor:
            cursor.execute(self.sql, params)
            return int(cursor.rowcount)


#: Compiled record statements by (model, database, shape of values); bounded: values
#: whose expressions vary fall back to the ORM once full.
_RECORDS: dict[tuple[Any, ...], _RecordStatement | None] = {}
_RECORDS_MAX = 64


def _record_statement(
    model: type[models.Model], using: str, values: Mapping[str, Any]
) -> _RecordStatement | None:
    """The compiled statement for *values* (PostgreSQL only), or ``None``: then the ORM
    writes it."""
    connection = transaction.get_connection(using)
    if connection.vendor != "postgresql":
        return None
    meta = model._meta
    shape = tuple(
        (
            name,
            repr(value)
            if hasattr(value, "resolve_expression") and not _plain_value(meta, name, value)
            else None,
        )
        for name, value in values.items()
    )
    key = (model, using, shape)
    try:
        return _RECORDS[key]
    except KeyError:
        pass
    if len(_RECORDS) >= _RECORDS_MAX:
        return None
    _RECORDS[key] = statement = _compile_record(model, using, values, connection)
    return statement


def _plain_value(meta: Any, name: str, value: Any) -> bool:
    """Whether *value* is a bare ``Value`` of field *name*'s own type (a time read once
    and written as it is, ``clock.now(moment)``): a parameter like a plain value, not a
    new statement per moment (each would fill the cache, then go through the ORM)."""
    if type(value) is not Value:
        return False
    output = getattr(value, "_output_field_or_none", None)
    try:
        return output is not None and type(output) is type(meta.get_field(name))
    except Exception:
        return False


def _compile_record(
    model: type[models.Model], using: str, values: Mapping[str, Any], connection: Any
) -> _RecordStatement | None:
    from django.db.models.sql.subqueries import UpdateQuery

    meta = model._meta
    q = connection.ops.quote_name
    query = UpdateQuery(model)
    compiler = query.get_compiler(using=using)
    assignments = []
    slots: list[tuple[Any, tuple[Any, ...] | None]] = []
    for name, value in values.items():
        try:
            field = meta.get_field(name)
        except Exception:  # an attname, a typo: the ORM says what is wrong
            return None
        if (
            not isinstance(field, models.Field)
            or hasattr(field, "get_placeholder")
            or not field.concrete
            or field.is_relation
        ):
            return None  # its own SQL placeholder, a relation: the ORM knows them
        if hasattr(value, "resolve_expression") and not _plain_value(meta, name, value):
            resolved = value.resolve_expression(query, allow_joins=False, for_save=True)
            if getattr(resolved, "contains_aggregate", False):
                return None
            sql, params = compiler.compile(resolved)
            assignments.append(f"{q(field.column)} = {sql}")
            slots.append((field, tuple(params)))
        else:
            assignments.append(f"{q(field.column)} = %s")
            slots.append((field, None))
    table = q(meta.db_table)
    sql = (
        f"UPDATE {table} SET {', '.join(assignments)} "
        f"WHERE {table}.{q('lock_token')} = %s AND {table}.{q('state')} = %s "
        f"AND {table}.{q(meta.pk.column)} = ANY(%s{array_cast(meta.pk, connection)})"
    )
    return _RecordStatement(sql, tuple(slots), meta.get_field("lock_token"))


def update_each(queryset: models.QuerySet[M], values: Mapping[Any, Mapping[str, Any]]) -> int:
    """Set per-row field values (``{pk: {field: value or expression}}``).

    Rows whose changes are identical share one UPDATE; the rest go in
    ``CASE`` statements of at most ``UPDATE_CHUNK`` rows, so no statement
    outgrows the database's parameter limit. Only rows that *queryset* still
    matches are changed; returns how many. Callers wrap it in a transaction.
    """
    groups: dict[tuple[tuple[str, Any], ...], tuple[Mapping[str, Any], list[Any]]] = {}
    singles: dict[Any, Mapping[str, Any]] = {}
    for pk, row in values.items():
        try:
            signature = tuple(sorted((name, comparable(v)) for name, v in row.items()))
            hash(signature)
        except TypeError:  # an expression: cannot be compared, give it a CASE of its own
            singles[pk] = row
            continue
        groups.setdefault(signature, (row, []))[1].append(pk)
    updated = 0
    for row, ids in groups.values():
        if len(ids) == 1:
            singles[ids[0]] = row
            continue
        for start in range(0, len(ids), UPDATE_CHUNK * 10):
            updated += with_ids(queryset, ids[start : start + UPDATE_CHUNK * 10]).update(**row)
    pks = list(singles)
    for start in range(0, len(pks), UPDATE_CHUNK):
        chunk = {pk: singles[pk] for pk in pks[start : start + UPDATE_CHUNK]}
        updated += _update_varying(queryset, chunk)
    return updated


def _update_varying(queryset: models.QuerySet[M], values: Mapping[Any, Mapping[str, Any]]) -> int:
    """One UPDATE of rows whose values differ: a field every row sets to the same value
    is set once, the others per row.

    Jobs that each return their own value share every field but ``return_value``; a
    CASE of Django expressions for every field cost about 6 ms a row to build (94,000
    ``resolve_expression`` calls for 1,000 rows), so plain values are written with
    ``PerRow``, compiled in one pass, and only expressions go through ``Case``.
    """
    names = {name for row in values.values() for name in row}
    assignments: dict[str, Any] = {}
    model = queryset.model
    for name in sorted(names):
        column = [row[name] for row in values.values() if name in row]
        output = model._meta.get_field(name)
        shared = len(column) == len(values)
        if shared and all(value is column[0] for value in column):
            assignments[name] = column[0]  # one object for every row (a shared change)
        elif any(hasattr(value, "resolve_expression") for value in column):
            whens = [
                When(pk=pk, then=_as_expression(row[name], output))
                for pk, row in values.items()
                if name in row
            ]
            assignments[name] = Case(*whens, default=F(name), output_field=output)  # type: ignore[arg-type]
        elif shared and _all_equal(column):
            assignments[name] = column[0]
        else:
            assignments[name] = PerRow(
                output, {pk: row[name] for pk, row in values.items() if name in row}
            )
    return with_ids(queryset, list(values)).update(**assignments)


def _all_equal(column: Sequence[Any]) -> bool:
    first = comparable(column[0])
    return all(comparable(value) == first for value in column[1:])


class PerRow(Expression):
    """``CASE pk WHEN … THEN … ELSE column END``: each row's own value of one field,
    each value prepared for the database as Django prepares a saved one (so typed as
    ``Value`` would type it), the column left as it is for a row not named."""

    def __init__(self, target: Any, values: Mapping[Any, Any]) -> None:
        super().__init__(output_field=target)
        self.target = target
        self.values = values

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        q = connection.ops.quote_name
        meta = self.target.model._meta
        table = q(meta.db_table)
        placeholder = getattr(self.target, "get_placeholder", None)
        parts = [f"CASE {table}.{q(meta.pk.column)}"]
        params: list[Any] = []
        for pk, value in self.values.items():
            prepared = self.target.get_db_prep_save(value, connection=connection)
            mark = placeholder(prepared, compiler, connection) if placeholder else "%s"
            parts.append(f" WHEN %s THEN {mark}")
            params.extend((meta.pk.get_db_prep_value(pk, connection), prepared))
        parts.append(f" ELSE {table}.{q(self.target.column)} END")
        return "".join(parts), params


_STR = {str}


def comparable(value: Any) -> Any:
    """What decides whether two rows set the same value and may share an UPDATE: the
    value with its type (``True == 1`` in Python, not in a JSON column), and for JSON
    lists and dicts their canonical text."""
    kind = type(value)
    if kind is list and set(map(type, value)) <= _STR:
        return ("strings", tuple(value))  # the common case (worker ids), without JSON
    if kind is dict or isinstance(value, list | dict):
        return ("json", json.dumps(value, sort_keys=True, default=str))
    return (kind, value)


def _as_expression(value: Any, output: Any) -> Any:
    if hasattr(value, "resolve_expression"):
        return value
    return Value(value, output_field=output)
