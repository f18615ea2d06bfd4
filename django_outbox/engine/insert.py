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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import models

from django_outbox.engine import clock


@dataclass(frozen=True)
class FastInsert:
    model: type[models.Model]
    sql: str
    #: Per parameter: the field's name and how to prepare its value.
    params: tuple[tuple[str, Callable[[Any, Any], Any]], ...]
    #: Every concrete field in model order: its name and where its value comes
    #: from ("pk", "clock", or a constant default; varying ones are in the row).
    columns: tuple[tuple[str, Any], ...]

    def run(
        self, connection: Any, row: Mapping[str, Any], raw: Mapping[str, Any] | None = None
    ) -> Any:
        """Insert *row* (field name → value; *raw* values go as they are, e.g. JSON text
        already encoded); return the new instance, or ``None`` if a conflict skipped it."""
        raw = raw or {}
        params = [
            raw[name] if name in raw else prepare(row[name], connection)
            for name, prepare in self.params
        ]
        with connection.cursor() as cursor:
            cursor.execute(self.sql, params)
            returned = cursor.fetchone()
        if returned is None:
            return None
        pk, stamped = returned[:2]
        convert = getattr(connection.ops, "convert_datetimefield_value", None)
        if convert is not None:  # SQLite returns text
            stamped = convert(stamped, None, connection)
        values = [
            pk if source == "pk" else stamped if source == "clock" else row.get(name, source)
            for name, source in self.columns
        ]
        return self.model.from_db(connection.alias, [name for name, _ in self.columns], values)

    def run_many(
        self, connection: Any, rows: Sequence[Mapping[str, Any]], raws: Sequence[Mapping[str, Any]]
    ) -> list[tuple[Any, ...]]:
        """Insert *rows* in one statement; return what ``RETURNING`` gave, one tuple per
        inserted row (rows skipped by a conflict give none; order is not promised)."""
        if not rows:
            return []
        start = self.sql.index(" VALUES ") + len(" VALUES ")
        ends = [i for i in (self.sql.find(" ON CONFLICT"), self.sql.find(" RETURNING")) if i > 0]
        end = min(ends)
        values = self.sql[start:end]
        sql = self.sql[:start] + ", ".join([values] * len(rows)) + self.sql[end:]
        params = [
            raw[name] if name in raw else prepare(row[name], connection)
            for row, raw in zip(rows, raws, strict=True)
            for name, prepare in self.params
        ]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall())


_CACHE: dict[tuple[Any, ...], FastInsert] = {}


def fast_insert(
    connection: Any,
    model: type[models.Model],
    *,
    varying: Sequence[str],
    clock_fields: Sequence[str],
    conflict_fields: Sequence[str] = (),
    returning_extra: str = "",
) -> FastInsert:
    """The cached INSERT of *model* on *connection*.

    *varying* fields are parameters; *clock_fields* get the database's now();
    every other column its default, as a literal. ``RETURNING`` gives the
    primary key and the first clock field (plus *returning_extra*, raw SQL
    such as a ``pg_notify(…)`` call, evaluated once per inserted row).
    """
    key = (connection.alias, model, tuple(varying), tuple(conflict_fields), returning_extra)
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
            values.append(_literal(default))
            sources.append((field.attname, default))
    stamped = _column(model, clock_fields[0])
    sql = f"INSERT INTO {q(meta.db_table)} ({', '.join(columns)}) VALUES ({', '.join(values)})"
    if conflict_fields:
        target = ", ".join(q(_column(model, name)) for name in conflict_fields)
        sql += f" ON CONFLICT ({target}) DO NOTHING"
    sql += f" RETURNING {q(meta.pk.column)}, {q(stamped)}"
    if returning_extra:
        sql += f", {returning_extra}"
    cached = _CACHE[key] = FastInsert(model, sql, tuple(params), tuple(sources))
    return cached


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


def _preparer(field: models.Field[Any, Any]) -> Callable[[Any, Any], Any]:
    def prepare(value: Any, connection: Any) -> Any:
        return field.get_db_prep_save(value, connection)

    return prepare
