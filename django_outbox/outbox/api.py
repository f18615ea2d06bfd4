"""``send()``: record the intent to send in the caller's transaction."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import OperationalError, connections, router, transaction
from django.db.models import F, Field
from django.utils import timezone

from django_outbox.conf import get_settings
from django_outbox.engine import clock, triggers
from django_outbox.engine.retry import is_transient
from django_outbox.exceptions import KeyConflict, PayloadTooLarge
from django_outbox.outbox.models import OutboxKey, OutboxMessage
from django_outbox.validation import check_headers, check_text, encode_json

MAX_TYPE_LENGTH = 255
MAX_KEY_LENGTH = 255


def send(
    type: str,
    payload: Any,
    *,
    to: str = "default",
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
    correlation_id: str | None = None,
    using: str | None = None,
) -> OutboxMessage:
    """Record a message for destination *to*; it is published after the transaction commits.

    Validation happens before anything touches the database, so a bad call
    raises (``InvalidMessage`` and its subclasses ``PayloadError`` and
    ``PayloadTooLarge``, or ``UnknownDestination``) and leaves the caller's
    transaction usable. Messages with
    the same *key* get increasing sequence numbers in commit order and are
    published in that order. Costs one INSERT (plus one counter UPSERT when a
    key is given) and at most one dispatch per transaction.
    """
    settings = get_settings()
    config = settings.outbox
    config.destination(to)
    check_text("type", type, MAX_TYPE_LENGTH, required=True)
    check_text("key", key, MAX_KEY_LENGTH)
    check_text("correlation_id", correlation_id, 255)
    header_map = check_headers(headers)
    text, size = encode_json(payload, what=f"payload of {type!r}")
    if size > config.max_payload_bytes:
        raise PayloadTooLarge(
            f"payload of {type!r} is {size} bytes encoded; MAX_PAYLOAD_BYTES is "
            f"{config.max_payload_bytes}"
        )
    db = using or router.db_for_write(OutboxMessage)
    row: dict[str, Any] = {
        "message_id": uuid.uuid4(),
        "type": type,
        "destination": to,
        # What will be published, not what was passed: Decimal and datetime
        # values become strings, integer keys become string keys.
        "payload": json.loads(text),
        "headers": header_map,
        "key": key,
        "sequence": None,
        "correlation_id": correlation_id,
        "blocked": False,
    }
    connection = connections[db]
    # NOTIFY mode on PostgreSQL: the INSERT itself queues the notification,
    # which PostgreSQL delivers at commit (once per transaction): no on-commit
    # callback, no extra statement, no extra commit.
    notify = (
        settings.notify_channel
        if settings.dispatch == "notify" and connection.vendor == "postgresql"
        else None
    )
    if connection.in_atomic_block:
        message = _insert(row, text, db, notify)
    else:
        # The key counter's row lock must last until the message row commits.
        with transaction.atomic(using=db):
            message = _insert(row, text, db, notify)
    if notify is None:
        triggers.schedule("outbox", db, message.pk)
    return message


def _insert(row: dict[str, Any], payload_json: str, db: str, notify: str | None) -> OutboxMessage:
    if row["key"] is not None:
        row["sequence"], row["blocked"] = next_sequence(db, row["destination"], row["key"])
    connection = connections[db]
    if not connection.features.can_return_columns_from_insert:
        # The database's clock, as everywhere else (see engine.clock). MySQL
        # cannot return it from the INSERT: the returned object shows this
        # host's time instead of another round trip.
        message = OutboxMessage(**row, created_at=clock.now(), available_at=clock.now())
        message.save(force_insert=True, using=db)
        message.created_at = message.available_at = timezone.now()
        return message
    # The hot path of every send(): one INSERT … RETURNING whose SQL is built
    # once per connection, with the columns that never vary written into it
    # and the payload's JSON text passed as it was validated, not encoded
    # again; the returned object is built the way querysets build theirs.
    # No model signals are sent for outbox rows.
    statement = _insert_statement(connection, notify)
    params = [
        payload_json if name == "payload" else prepare(row[name], connection)
        for name, prepare in statement.params
    ]
    with connection.cursor() as cursor:
        cursor.execute(statement.sql, params)
        pk, created_at = cursor.fetchone()[:2]
    convert = getattr(connection.ops, "convert_datetimefield_value", None)
    if convert is not None:  # SQLite returns text
        created_at = convert(created_at, None, connection)
    values = [
        pk if source == "pk" else created_at if source == "clock" else row.get(name, source)
        for name, source in statement.columns
    ]
    return OutboxMessage.from_db(db, [name for name, _ in statement.columns], values)


@dataclass(frozen=True)
class _InsertStatement:
    sql: str
    #: Per parameter: the field's name and how to prepare its value.
    params: tuple[tuple[str, Callable[[Any, Any], Any]], ...]
    #: Every concrete field in model order: its name and where its value comes
    #: from ("pk", "clock", or a constant default; varying ones are in the row).
    columns: tuple[tuple[str, Any], ...]


#: The fields a send() sets; every other column is written with its default.
_VARYING = (
    "message_id",
    "type",
    "destination",
    "payload",
    "headers",
    "key",
    "sequence",
    "correlation_id",
    "blocked",
)
#: Set from the database's clock in the INSERT itself (see engine.clock).
_CLOCK_COLUMNS = ("created_at", "available_at")
_INSERT_CACHE: dict[tuple[str, str | None], _InsertStatement] = {}


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


def _insert_statement(connection: Any, notify: str | None = None) -> _InsertStatement:
    cached = _INSERT_CACHE.get((connection.alias, notify))
    if cached is not None:
        return cached
    meta = OutboxMessage._meta
    q = connection.ops.quote_name
    columns: list[str] = []
    values: list[str] = []
    params: list[tuple[str, Callable[[Any, Any], Any]]] = []
    sources: list[tuple[str, Any]] = []
    probe = OutboxMessage.objects.using(connection.alias).all()
    now_sql, now_params = clock.sql_for(clock.now(), probe)
    assert not now_params
    for field in meta.concrete_fields:
        if field.primary_key:
            sources.append((field.attname, "pk"))
            continue
        columns.append(q(field.column))
        if field.attname in _VARYING:
            values.append("%s")
            params.append((field.attname, _preparer(field)))
            sources.append((field.attname, None))
        elif field.attname in _CLOCK_COLUMNS:
            values.append(now_sql)
            sources.append((field.attname, "clock"))
        else:
            default = field.get_default()
            values.append(_literal(default))
            sources.append((field.attname, default))
    sql = (
        f"INSERT INTO {q(meta.db_table)} ({', '.join(columns)}) VALUES ({', '.join(values)}) "
        f"RETURNING {q(meta.pk.column)}, {q('created_at')}"
    )
    if notify is not None:  # an identifier (checked by the settings)
        sql += f", pg_notify('{notify}', 'outbox')"
    cached = _INSERT_CACHE[(connection.alias, notify)] = _InsertStatement(
        sql, tuple(params), tuple(sources)
    )
    return cached


def _preparer(field: Field[Any, Any]) -> Callable[[Any, Any], Any]:
    def prepare(value: Any, connection: Any) -> Any:
        return field.get_db_prep_save(value, connection)

    return prepare


def next_sequence(db: str, destination: str, key: str) -> tuple[int, bool]:
    """Take the next sequence number of (*destination*, *key*), and whether the key is
    parked (a failed message holds it back: the new one parks behind it).

    The counter row stays locked until the caller's transaction ends, so a
    concurrent sender of the same key waits: sequence order is commit order.
    Under REPEATABLE READ or SERIALIZABLE a concurrent sender of the same key
    that committed first makes the database abort the caller's transaction;
    that surfaces as ``KeyConflict``, which says so and what to do.
    """
    try:
        return _next_sequence(db, destination, key)
    except OperationalError as exc:
        if not is_transient(exc):
            raise
        cause = exc.__cause__ or exc
        if getattr(cause, "sqlstate", None) == "40001":
            why = (
                "under REPEATABLE READ or SERIALIZABLE isolation a concurrent send of the "
                "same key committed first"
            )
            advice = (
                "Retry the whole transaction, or send keyed messages from READ COMMITTED "
                "transactions (Django's default)"
            )
        else:
            why = f"the database chose this transaction as a deadlock victim ({cause})"
            advice = (
                "Retry the whole transaction; transactions that send to several keys avoid "
                "deadlocks by sending them in the same order"
            )
        raise KeyConflict(
            f"send(key={key!r}) to {destination!r} failed: {why}; the transaction was "
            f"aborted and cannot be used further. {advice}"
        ) from exc


def _next_sequence(db: str, destination: str, key: str) -> tuple[int, bool]:
    connection = connections[db]
    if connection.features.can_return_columns_from_insert and connection.vendor in (
        "postgresql",
        "sqlite",
    ):
        q = connection.ops.quote_name
        table, last = q(OutboxKey._meta.db_table), q("last_sequence")
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} ({q('destination')}, {q('key')}, {last}, {q('blocked')}) "
                "VALUES (%s, %s, 1, %s) "
                f"ON CONFLICT ({q('destination')}, {q('key')}) DO UPDATE "
                f"SET {last} = {table}.{last} + 1 RETURNING {last}, {q('blocked')}",
                [destination, key, False],
            )
            sequence, blocked = cursor.fetchone()
            return int(sequence), bool(blocked)
    if connection.vendor == "mysql":
        q = connection.ops.quote_name
        table, last = q(OutboxKey._meta.db_table), q("last_sequence")
        where = f"{q('destination')} = %s AND {q('key')} = %s"
        with connection.cursor() as cursor:
            # The upsert locks the counter row until commit; the SELECT in the
            # same transaction reads the value this transaction wrote.
            cursor.execute(
                f"INSERT INTO {table} ({q('destination')}, {q('key')}, {last}, {q('blocked')}) "
                f"VALUES (%s, %s, 1, %s) ON DUPLICATE KEY UPDATE {last} = {last} + 1",
                [destination, key, False],
            )
            cursor.execute(
                f"SELECT {last}, {q('blocked')} FROM {table} WHERE {where}", [destination, key]
            )
            sequence, blocked = cursor.fetchone()
            return int(sequence), bool(blocked)
    counters = OutboxKey.objects.using(db)
    row, created = counters.select_for_update().get_or_create(
        destination=destination, key=key, defaults={"last_sequence": 1}
    )
    if created:
        return 1, False
    counters.filter(pk=row.pk).update(last_sequence=F("last_sequence") + 1)
    return row.last_sequence + 1, row.blocked
