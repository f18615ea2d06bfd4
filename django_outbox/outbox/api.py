"""``send()``: record the intent to send in the caller's transaction."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.db import OperationalError, connections, router, transaction
from django.utils import timezone

from django_outbox import metrics, tracing
from django_outbox.conf import get_settings
from django_outbox.engine import clock, ordering, triggers
from django_outbox.engine.ids import uuid7
from django_outbox.engine.insert import fast_insert
from django_outbox.engine.retry import is_transient
from django_outbox.exceptions import KeyConflict, PayloadTooLarge
from django_outbox.outbox.models import OutboxKey, OutboxMessage
from django_outbox.validation import check_headers, check_text, encode_json
from django_outbox.wire import HEADER_REPLY_TO

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
    reply_to: str | None = None,
    using: str | None = None,
) -> OutboxMessage:
    """Record a message for destination *to*; it is published after the transaction commits.

    *reply_to* makes it a request: it names the inbox source on which this
    service receives the other side's reply. The message gets a correlation
    id (its own message id unless one is given) and an ``outbox-reply-to``
    header; a reply that arrives on that source with that correlation id is
    matched to it (both rows show it in the admin).

    Validation happens before anything touches the database, so a bad call
    raises (``InvalidMessage`` and its subclasses ``PayloadError`` and
    ``PayloadTooLarge``, or ``UnknownDestination``) and leaves the caller's
    transaction usable. Messages with
    the same *key* get increasing sequence numbers in commit order and are
    published in that order. Costs one INSERT (plus one counter UPSERT when a
    key is given) and at most one dispatch per transaction. The context of the
    current span is stored in the headers when tracing is on (``django_outbox.tracing``).
    """
    settings = get_settings()
    config = settings.outbox
    config.destination(to)
    check_text("type", type, MAX_TYPE_LENGTH, required=True)
    check_text("key", key, MAX_KEY_LENGTH)
    check_text("correlation_id", correlation_id, 255)
    header_map = check_headers(headers)
    if tracing.enabled():
        tracing.inject(header_map)
    check_text("reply_to", reply_to, 100)
    text, size = encode_json(payload, what=f"payload of {type!r}")
    if size > config.max_payload_bytes:
        raise PayloadTooLarge(
            f"payload of {type!r} is {size} bytes encoded; MAX_PAYLOAD_BYTES is "
            f"{config.max_payload_bytes}"
        )
    db = using or router.db_for_write(OutboxMessage)
    message_id = uuid7()
    if reply_to is not None:
        header_map[HEADER_REPLY_TO] = reply_to
        correlation_id = correlation_id or str(message_id)
    row: dict[str, Any] = {
        "message_id": message_id,
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
        message = _insert(row, text, connection, notify)
    else:
        # The key counter's row lock must last until the message row commits.
        with transaction.atomic(using=db):
            message = _insert(row, text, connection, notify)
    if notify is None:
        triggers.schedule("outbox", db, message.pk)
    if metrics.enabled():
        metrics.counted_on_commit("outbox", "enqueued", to, db)
    return message


def _insert(
    row: dict[str, Any], payload_json: str, connection: Any, notify: str | None
) -> OutboxMessage:
    db = connection.alias
    if row["key"] is not None:
        row["sequence"], row["blocked"] = next_sequence(db, row["destination"], row["key"])
    if not connection.features.can_return_columns_from_insert:
        # The database's clock, as everywhere else (see engine.clock). MySQL
        # cannot return it from the INSERT: the returned object shows this
        # host's time instead of another round trip.
        message = OutboxMessage(**row, created_at=clock.now(), available_at=clock.now())
        message.save(force_insert=True, using=db)
        message.created_at = message.available_at = timezone.now()
        return message
    # The hot path of every send(): one INSERT … RETURNING built once per
    # connection (see engine.insert), the payload's JSON text passed as it was
    # validated, not encoded again. Optional fields left at their defaults are not
    # parameters: the statement writes those defaults itself (one variant per set).
    returning = f"pg_notify('{notify}', 'outbox')" if notify is not None else ""
    varying = _VARYING + tuple(name for name, default in _OPTIONAL if row[name] is not default)
    statement = fast_insert(
        connection,
        OutboxMessage,
        varying=varying,
        clock_fields=_CLOCK_COLUMNS,
        returning_extra=returning,  # notify: an identifier (checked by the settings)
    )
    inserted: OutboxMessage = statement.run(connection, row, raw={"payload": payload_json})
    return inserted


#: The fields a send() sets; every other column is written with its default.
_VARYING = ("message_id", "type", "destination", "payload", "headers")
#: The fields a send() sets only when they differ from their default (immutable values,
#: compared by identity: an instance gets the default itself).
_OPTIONAL = (("key", None), ("sequence", None), ("correlation_id", None), ("blocked", False))
#: Set from the database's clock in the INSERT itself (see engine.clock).
_CLOCK_COLUMNS = ("created_at", "available_at")


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
        return ordering.next_sequence(db, OutboxKey, {"destination": destination, "key": key})
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
