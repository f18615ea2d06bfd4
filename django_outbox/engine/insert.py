"""The hot insert of a part's row: one ``INSERT … RETURNING`` built once per connection.

``send()`` and ``receive()`` run inside business transactions, once per
message, so their INSERT is built once per database connection: columns
that never vary are written into the SQL as literals, due times use the
database's clock in the statement itself (see ``engine.clock``), JSON
already validated is passed as text, and the returned object is built the
way querysets build theirs (no model signals). ``ON CONFLICT … DO NOTHING``
makes it idempotent (the inbox): a duplicate returns no row.

Used where the database returns columns from an INSERT (PostgreSQL, SQLite);
elsewhere callers save the model the ordinary way.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import models

from django_outbox.engine import clock
from django_outbox.engine.partitions import Guard
from django_outbox.engine.rows import (
    binding_cursor,
    builds_directly,
    fast_timestamps,
    instance_builder,
)


@dataclass(frozen=True)
class FastInsert:
    model: type[models.Model]
    sql: str
    #: Per parameter: the field's name and how to prepare its value.
    params: tuple[tuple[str, Callable[[Any, Any], Any]], ...]
    #: Every concrete field in model order: its name and where its value comes
    #: from ("pk", "clock", or a constant default; varying ones are in the row).
    columns: tuple[tuple[str, Any], ...]
    #: The fields of the conflict target (``run_many`` matches rows by them).
    conflict_fields: tuple[str, ...] = ()
    #: ``run_many`` elsewhere than PostgreSQL: ``prefix + ", ".join([values] * n) + suffix``.
    many_prefix: str = ""
    many_values: str = ""
    many_suffix: str = ""
    #: ``run_many`` on PostgreSQL: one array parameter per varying field (``%b``: sent in
    #: binary where the cursor binds on the server; a client-side one quotes it as any).
    bulk_sql: str | None = None
    bulk_params: tuple[tuple[str, Callable[[Any, Any], Any]], ...] = ()
    #: A guard's fields (``partitions.Guard``): their values come first, as they are.
    guard_fields: tuple[str, ...] = ()
    #: ``builder``'s direct builders, by connection alias.
    _builders: dict[str, Callable[..., Any]] = dataclasses.field(
        default_factory=dict, compare=False, repr=False
    )

    def run(
        self, connection: Any, row: Mapping[str, Any], raw: Mapping[str, Any] | None = None
    ) -> Any:
        """Insert *row* (field name → value; *raw* values go as they are, e.g. JSON text
        already encoded); return the new instance, or ``None`` if a conflict skipped it."""
        returned = self.run_bare(connection, row, raw)
        if returned is None:
            return None
        return self.builder(connection)(*returned, row)

    def builder(self, connection: Any) -> Callable[[Any, Any, Mapping[str, Any]], Any]:
        """A function making the instance of a row this statement inserted on
        *connection*, from its primary key, its clock stamp and the *row* it was given,
        as querysets make theirs (``rows.instance_builder``)."""
        names, clocks, varying, constants = self._layout
        if not builds_directly(self.model, names):
            build = instance_builder(
                self.model, connection.alias, [name for name, _ in self.columns], direct=False
            )
            columns = self.columns

            def in_model_order(pk: Any, stamped: Any, row: Mapping[str, Any]) -> Any:
                return build(
                    [
                        pk
                        if source == "pk"
                        else stamped
                        if source == "clock"
                        else row.get(name, source)
                        for name, source in columns
                    ]
                )

            return in_model_order
        made = self._builders.get(connection.alias)
        if made is None:
            # Made directly, the instance takes its values in any order: the primary key,
            # the clock stamps, the varying values (picked from the row in one C call)
            # and the constants, without looking at each column for each row.
            build = instance_builder(self.model, connection.alias, names, direct=True)
            pick: Callable[[Mapping[str, Any]], tuple[Any, ...]] = (
                operator.itemgetter(*varying)
                if len(varying) > 1
                else lambda row: tuple(row[name] for name in varying)
            )
            defaults = tuple(constants.values())

            def made(pk: Any, stamped: Any, row: Mapping[str, Any]) -> Any:
                return build((pk, *(stamped,) * clocks, *pick(row), *defaults))

            self._builders[connection.alias] = made
        return made

    def run_bare(
        self, connection: Any, row: Mapping[str, Any], raw: Mapping[str, Any] | None = None
    ) -> tuple[Any, Any] | None:
        """``run`` without the instance: the new row's primary key and clock stamp
        (``None`` if a conflict skipped it), for callers that build their own result."""
        raw = raw or {}
        params = [row[name] for name in self.guard_fields]
        params += [
            raw[name] if name in raw else prepare(row[name], connection)
            for name, prepare in self.params
        ]
        with connection.cursor() as cursor:
            fast_timestamps(cursor, connection)
            cursor.execute(self.sql, params)
            returned = cursor.fetchone()
        if returned is None:
            return None
        pk, stamped = returned[:2]
        convert = getattr(connection.ops, "convert_datetimefield_value", None)
        if convert is not None:  # SQLite returns text
            stamped = convert(stamped, None, connection)
        return pk, stamped

    def run_many(
        self, connection: Any, rows: Sequence[Mapping[str, Any]], raws: Sequence[Mapping[str, Any]]
    ) -> list[Any]:
        """Insert *rows* in one statement; return the new instances, in the order of
        *rows* (rows a conflict skipped give none, a key repeated within *rows* is
        inserted once).

        PostgreSQL gets one array per column and ``INSERT … SELECT … FROM unnest(…)``:
        the statement's text never changes, so the driver parses it once, however
        many rows there are. Elsewhere, a multi-row ``VALUES`` list.
        """
        if not rows:
            return []
        assert self.conflict_fields, "run_many matches what it inserted by the conflict key"
        if self.bulk_sql is not None:
            assert not self.guard_fields or self.bulk_sql, "a guard is PostgreSQL's"
            sql = self.bulk_sql
            params: list[Any] = [
                [
                    raw[name] if name in raw else prepare(row[name], connection)
                    for row, raw in zip(rows, raws, strict=True)
                ]
                for name, prepare in self.bulk_params
            ]
        else:
            sql = self.many_prefix + ", ".join([self.many_values] * len(rows)) + self.many_suffix
            params = [
                raw[name] if name in raw else prepare(row[name], connection)
                for row, raw in zip(rows, raws, strict=True)
                for name, prepare in self.params
            ]
        with (
            binding_cursor(connection)
            if self.bulk_sql is not None
            else connection.cursor() as cursor
        ):
            fast_timestamps(cursor, connection)
            cursor.execute(sql, params)
            returned = cursor.fetchall()
        convert = getattr(connection.ops, "convert_datetimefield_value", None)
        inserted = {tuple(r[2:]): r[:2] for r in returned}
        build = self.builder(connection)
        instances = []
        for row in rows:
            got = inserted.pop(tuple(row[name] for name in self.conflict_fields), None)
            if got is None:
                continue
            pk, stamped = got
            if convert is not None:  # SQLite returns text
                stamped = convert(stamped, None, connection)
            instances.append(build(pk, stamped, row))
        return instances

    @functools.cached_property
    def _layout(self) -> tuple[tuple[str, ...], int, tuple[str, ...], dict[str, Any]]:
        """How ``builder`` lays out a row made directly: every field's name (the primary
        key, the clock fields, the varying ones in the order of ``params``, the
        constants), how many clock fields, the varying fields, the constants by name."""
        varying = tuple(name for name, _ in self.params)
        pk_name = next(name for name, source in self.columns if source == "pk")
        clocks = tuple(name for name, source in self.columns if source == "clock")
        constants = {
            name: source
            for name, source in self.columns
            if source not in ("pk", "clock") and name not in varying
        }
        return (pk_name, *clocks, *varying, *constants), len(clocks), varying, constants


_CACHE: dict[tuple[Any, ...], FastInsert] = {}


def fast_insert(
    connection: Any,
    model: type[models.Model],
    *,
    varying: Sequence[str],
    clock_fields: Sequence[str],
    conflict_fields: Sequence[str] = (),
    returning_extra: str = "",
    guard: Guard | None = None,
) -> FastInsert:
    """The cached INSERT of *model* on *connection*.

    *varying* fields are parameters; *clock_fields* get the database's now();
    every other column its default, as a literal. ``RETURNING`` gives the
    primary key and the first clock field (plus *returning_extra*, raw SQL
    such as a ``pg_notify(…)`` call, evaluated once per inserted row).

    With a *guard* (PostgreSQL, a partitioned inbox), the guard's table gets the
    row's guarded fields first, in the same statement, ``ON CONFLICT DO NOTHING``, and
    the row is inserted only where that row was new: the guard's unique index stands
    in for *conflict_fields*' (a partitioned table cannot have it).
    """
    key = (connection.alias, model, tuple(varying), tuple(conflict_fields), returning_extra, guard)
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    meta = model._meta
    q = connection.ops.quote_name
    columns: list[str] = []
    values: list[str] = []
    params: list[tuple[str, Callable[[Any, Any], Any]]] = []
    sources: list[tuple[str, Any]] = []
    probe = model._default_manager.using(connection.alias).all()
    now_sql, now_params = clock.sql_for(clock.now(), probe)
    assert not now_params
    for field in meta.concrete_fields:
        if field.primary_key:
            sources.append((field.attname, "pk"))
            continue
        columns.append(q(field.column))
        if field.attname in varying:
            values.append("%s")
            params.append((field.attname, _preparer(field)))
            sources.append((field.attname, None))
        elif field.attname in clock_fields:
            values.append(now_sql)
            sources.append((field.attname, "clock"))
        else:
            default = field.get_default()
            sources.append((field.attname, default))
            if _database_fills(field, default):
                columns.pop()  # a shorter statement: the database writes the same value
            elif isinstance(field, models.JSONField) and default is not None:
                values.append(_literal(json.dumps(default, cls=field.encoder)))
            else:
                values.append(_literal(default))
    stamped = _column(model, clock_fields[0])
    into = f"INSERT INTO {q(meta.db_table)} ({', '.join(columns)})"
    conflict = ""
    if conflict_fields and guard is None:
        target = ", ".join(q(_column(model, name)) for name in conflict_fields)
        conflict = f" ON CONFLICT ({target}) DO NOTHING"
    returning = f" RETURNING {q(meta.pk.column)}, {q(stamped)}"
    extra = f", {returning_extra}" if returning_extra else ""
    by_key = "".join(f", {q(_column(model, name))}" for name in conflict_fields)
    many_values = f"({', '.join(values)})"
    single = f"{into} VALUES {many_values}{conflict}{returning}{extra}"
    if guard is not None:
        assert connection.vendor == "postgresql", "a guard is PostgreSQL's"
        seen = f"{q(guard.table)} ({', '.join(map(q, guard.fields))}, {q(guard.time_column)})"
        holes = ", ".join(["%s"] * len(guard.fields))
        single = (
            f"WITH s AS (INSERT INTO {seen} VALUES ({holes}, {now_sql}) "
            f"ON CONFLICT DO NOTHING RETURNING 1) "
            f"{into} SELECT {', '.join(values)} FROM s{returning}{extra}"
        )
    bulk_sql = None
    if connection.vendor == "postgresql":
        # Parameters become the columns of unnest(); JSON goes as text, cast per row.
        # Arrays go in binary (%b): psycopg quotes every element of a text-format array
        # with regular expressions in Python (about 2 µs an element), and dumps a binary
        # one without (a tenth of it).
        arrays: list[str] = []
        selected: list[str] = []
        written = [f for f in _non_pk(meta) if q(f.column) in columns]
        for value, field in zip(values, written, strict=True):
            if field.attname not in varying:
                selected.append(value)
                continue
            name = f"u{len(arrays)}"
            if isinstance(field, models.JSONField):
                arrays.append("%b::text[]")
                selected.append(f"{name}::jsonb")
            else:
                arrays.append(f"%b::{field.cast_db_type(connection)}[]")
                selected.append(name)
        names = ", ".join(f"u{n}" for n in range(len(arrays)))
        bulk_sql = (
            f"{into} SELECT {', '.join(selected)} FROM unnest({', '.join(arrays)}) "
            f"AS u({names}){conflict}{returning}{by_key}"
        )
        if guard is not None:
            # The first of each guarded value within the batch, if the guard had not it.
            by_name = {name: f"u{n}" for n, (name, _) in enumerate(params)}
            guarded = [by_name[name] for name in guard.fields]
            matched = " AND ".join(
                f"s.{q(name)} = u.{column}"
                for name, column in zip(guard.fields, guarded, strict=True)
            )
            bulk_sql = (
                f"WITH u AS (SELECT DISTINCT ON ({', '.join(guarded)}) * "
                f"FROM unnest({', '.join(arrays)}) WITH ORDINALITY AS u({names}, ord) "
                f"ORDER BY {', '.join(guarded)}, ord), "
                f"s AS (INSERT INTO {seen} SELECT {', '.join(guarded)}, {now_sql} FROM u "
                f"ON CONFLICT DO NOTHING RETURNING {', '.join(map(q, guard.fields))}) "
                f"{into} SELECT {', '.join(selected)} FROM u JOIN s ON {matched}"
                f"{returning}{by_key}"
            )
    cached = _CACHE[key] = FastInsert(
        model,
        single,
        tuple(params),
        tuple(sources),
        conflict_fields=tuple(conflict_fields),
        many_prefix=f"{into} VALUES ",
        many_values=many_values,
        many_suffix=f"{conflict}{returning}{by_key}",
        bulk_sql=bulk_sql,
        bulk_params=tuple((name, _bulk_preparer(meta.get_field(name))) for name, _ in params),
        guard_fields=guard.fields if guard is not None else (),
    )
    return cached


def _non_pk(meta: Any) -> list[Any]:
    return [field for field in meta.concrete_fields if not field.primary_key]


def _database_fills(field: Any, default: Any) -> bool:
    """Whether leaving *field* out of an INSERT stores its *default* all the same: NULL
    for a nullable column without a database default, or a database default that is
    the same plain value."""
    if field.has_db_default():
        db_default = field.db_default
        return not hasattr(db_default, "resolve_expression") and db_default == default
    return default is None and field.null


def _column(model: type[models.Model], name: str) -> str:
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field)
    return str(field.column)


def _literal(value: Any) -> str:
    """SQL for a constant default (None, a boolean, an integer or a plain string)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.isprintable():
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f"no literal for default {value!r}")


def _bulk_preparer(field: Any) -> Callable[[Any, Any], Any]:
    """An element of a PostgreSQL array parameter: JSON as its text, the rest as usual."""
    if isinstance(field, models.JSONField):
        # Made once, as ``json.dumps(value, cls=field.encoder)`` would make it each time.
        text_of = (field.encoder or json.JSONEncoder)().encode

        def encode(value: Any, connection: Any) -> Any:
            if value is None:
                return None
            if type(value) is dict and not value:
                return "{}"  # most rows' headers: not worth an encoder's call
            return text_of(value)

        return encode
    return _preparer(field)


#: Stock field classes whose ``get_db_prep_save`` gives a value of these types back
#: unchanged (subclasses may override it, so only the exact classes count).
_UNCHANGED: dict[type[models.Field[Any, Any]], tuple[type, ...]] = {
    models.CharField: (str,),
    models.TextField: (str,),
    models.IntegerField: (int,),
    models.SmallIntegerField: (int,),
    models.BigIntegerField: (int,),
    models.PositiveIntegerField: (int,),
    models.PositiveSmallIntegerField: (int,),
}


def _preparer(field: models.Field[Any, Any]) -> Callable[[Any, Any], Any]:
    """The field's ``get_db_prep_save``, skipped for None and for values it would
    return as they are (a str for a CharField, an int for an IntegerField, a UUID
    where the database has a uuid type): on the hot insert it cost more than the
    rest of the parameters' handling."""
    native_uuid = type(field) is models.UUIDField
    unchanged = _UNCHANGED.get(type(field), ())
    if unchanged or native_uuid:
        unchanged += (type(None),)  # these fields save None as NULL

    def prepare(value: Any, connection: Any) -> Any:
        kind = type(value)
        if kind in unchanged:  # exact types: a bool is not an int here
            return value
        if native_uuid and kind is uuid.UUID and connection.features.has_native_uuid_field:
            return value
        return field.get_db_prep_save(value, connection)

    return prepare
