"""``receive()``: store an incoming message once, in the caller's transaction."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import IntegrityError, connections, router, transaction

from django_outbox import metrics, tracing
from django_outbox.conf import get_settings
from django_outbox.engine import clock, partitions, triggers
from django_outbox.engine.insert import fast_insert
from django_outbox.exceptions import InvalidMessage
from django_outbox.inbox.models import InboxMessage, InboxSeen
from django_outbox.validation import check_headers, check_text, encode_json

MAX_TYPE_LENGTH = 255
MAX_KEY_LENGTH = 255
MAX_SOURCE_LENGTH = 100
MAX_MESSAGE_ID_LENGTH = 255
#: The largest sequence the column holds (a signed 64-bit integer).
MAX_SEQUENCE = 2**63 - 1


def receive(
    type: str,
    payload: Any,
    *,
    source: str,
    message_id: str | uuid.UUID,
    key: str | None = None,
    sequence: int | None = None,
    headers: Mapping[str, str] | None = None,
    correlation_id: str | None = None,
    using: str | None = None,
    trigger: bool = True,
) -> tuple[InboxMessage, bool]:
    """Store an incoming message unless (source, message id) is already stored.

    Returns ``(message, created)``. A duplicate returns the stored row with
    ``created=False`` and does nothing else: no second handling, no trigger.
    A new row is ``should_be_handled``; when the surrounding transaction
    commits (at once without one), its handler is triggered as ``DISPATCH``
    says (``trigger=False``: not, for a caller that handles it itself).
    Raises ``InvalidMessage`` (``PayloadError`` for the payload and headers)
    for arguments that cannot be stored; nothing is stored then.
    """
    row, text = prepare(
        type,
        payload,
        source=source,
        message_id=message_id,
        key=key,
        sequence=sequence,
        headers=headers,
        correlation_id=correlation_id,
    )
    using = using or router.db_for_write(InboxMessage)
    message = _insert(using, row, text, trigger=trigger, build=True)
    if message is None:
        metrics.counted_on_commit("inbox", "duplicates", source, using)
        return _stored(using, source, row["message_id"]), False
    metrics.counted_on_commit("inbox", "received", source, using)
    return message, True


def receive_prepared(prepared: tuple[dict[str, Any], str], *, using: str | None = None) -> bool:
    """Store one message ``prepare()`` made, as ``receive()`` does (its handler triggered
    on commit), and say whether it was new. Builds no row object and reads nothing back
    for a duplicate: for a caller that answers with the id alone (the webhook view)."""
    row, text = prepared
    using = using or router.db_for_write(InboxMessage)
    created = _insert(using, row, text, trigger=True, build=False) is not None
    metrics.counted_on_commit(
        "inbox", "received" if created else "duplicates", row["source"], using
    )
    return created


def _insert(using: str, row: dict[str, Any], text: str, *, trigger: bool, build: bool) -> Any:
    """Insert a prepared message unless its id is stored; ``None`` for a duplicate, else
    the new row (with *build*) or its primary key. A new row's handler is triggered on
    commit unless *trigger* is false."""
    connection = connections[using]
    # NOTIFY mode on PostgreSQL, as send() does: the INSERT queues the notification of
    # a new row itself, delivered at commit (once per transaction), instead of an
    # on-commit callback sending it in a statement and a transaction of its own.
    notify = (
        get_settings().notify_channel
        if trigger and connection.vendor == "postgresql" and get_settings().dispatch == "notify"
        else None
    )
    if connection.vendor in ("postgresql", "sqlite") and (
        connection.features.can_return_columns_from_insert
    ):
        # One statement: INSERT … ON CONFLICT DO NOTHING RETURNING. A duplicate
        # inserts nothing, takes no savepoint and leaves the transaction alone.
        statement = _statement(connection, notify)
        insert = statement.run if build else statement.run_bare
        raw = {"payload": text}
        inserted = insert(connection, row, raw)
        if inserted is None and _forgotten(using, row["source"], row["message_id"]):
            inserted = insert(connection, row, raw)
        if inserted is None:
            return None
        new = inserted if build else inserted[0]
    else:
        message = _insert_with_savepoint(using, row)
        if message is None:
            return None
        new = message if build else message.pk
    if trigger and notify is None:
        triggers.schedule("inbox", using, new.pk if build else new)
    return new


def prepare(
    type: str,
    payload: Any,
    *,
    source: str,
    message_id: str | uuid.UUID,
    key: str | None = None,
    sequence: int | None = None,
    headers: Mapping[str, str] | None = None,
    correlation_id: str | None = None,
    decoded: bool = False,
    text: str | None = None,
    context: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], str]:
    """Check ``receive()``'s arguments; return the row's fields and the payload's JSON
    text, or raise ``InvalidMessage``.

    *decoded* says the payload is what ``json.loads`` made of a body: it is stored as it
    is, since decoding its JSON text again would only give it back equal; *text*, given
    with *decoded*, is that body's JSON text when ``intake.parse`` found it storable as
    it is (nothing ``encode_json`` would refuse): it is stored without encoding the
    payload again. *context* is
    the trace context to add to the headers, ``tracing.context_headers()`` read once
    for a batch (``None``: read here)."""
    check_text("type", type, MAX_TYPE_LENGTH, required=True)
    check_text("source", source, MAX_SOURCE_LENGTH, required=True)
    if isinstance(message_id, uuid.UUID):
        message_id = str(message_id)
    check_text("message_id", message_id, MAX_MESSAGE_ID_LENGTH, required=True)
    check_text("key", key, MAX_KEY_LENGTH)
    check_text("correlation_id", correlation_id, 255)
    if sequence is not None and (
        isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 0
    ):
        raise InvalidMessage(f"sequence must be a non-negative integer, got {sequence!r}")
    if sequence is not None and sequence > MAX_SEQUENCE:
        raise InvalidMessage(f"sequence {sequence} is out of range: at most {MAX_SEQUENCE}")
    if sequence is not None and key is None:
        raise InvalidMessage("a sequence needs a key: it orders the messages of one key")
    header_map = check_headers(headers)
    if tracing.enabled():
        tracing.inject(header_map, context)
    if text is None or not decoded:
        text, _ = encode_json(payload, what=f"payload of {type!r}")
    row = {
        "source": source,
        "message_id": message_id,
        "type": type,
        # What is stored, not what was passed (Decimal and datetime become strings).
        "payload": payload if decoded else json.loads(text),
        "headers": header_map,
        "key": key,
        "sequence": sequence,
        "correlation_id": correlation_id,
    }
    return row, text


def receive_many(
    prepared: Sequence[tuple[dict[str, Any], str]], *, using: str | None = None
) -> tuple[list[InboxMessage], int]:
    """Store many prepared messages at once (``inbox_consume``); return the new rows
    and how many were duplicates. No trigger: the caller handles them.

    PostgreSQL: one ``INSERT … SELECT … FROM unnest(…)`` per 5,000 rows; SQLite:
    one multi-row ``INSERT`` per 500; both ``ON CONFLICT DO NOTHING``.
    MySQL/MariaDB: row by row, each in a savepoint.
    """
    using = using or router.db_for_write(InboxMessage)
    connection = connections[using]
    new: list[InboxMessage] = []
    if connection.vendor in ("postgresql", "sqlite") and (
        connection.features.can_return_columns_from_insert
    ):
        statement = _statement(connection)
        chunk_size = 5000 if statement.bulk_sql is not None else 500
        for start in range(0, len(prepared), chunk_size):
            chunk = prepared[start : start + chunk_size]
            new.extend(
                statement.run_many(
                    connection, [row for row, _ in chunk], [{"payload": t} for _, t in chunk]
                )
            )
        return new, len(prepared) - len(new)
    for row, _ in prepared:
        message = _insert_with_savepoint(using, row)
        if message is not None:
            new.append(message)
    return new, len(prepared) - len(new)


def _statement(connection: Any, notify: str | None = None) -> Any:
    """The inbox's INSERT on *connection*; with *notify* (a channel), one that also
    queues ``pg_notify(notify, 'inbox')`` for the row it inserts."""
    return fast_insert(
        connection,
        InboxMessage,
        varying=_VARYING,
        clock_fields=("created_at", "available_at"),
        conflict_fields=("source", "message_id"),
        # notify: an identifier (checked by the settings)
        returning_extra=f"pg_notify('{notify}', 'inbox')" if notify is not None else "",
        guard=_SEEN if partitions.is_partitioned(InboxMessage, connection.alias) else None,
    )


#: A partitioned inbox's deduplication (``engine.partitions``).
_SEEN = partitions.Guard(
    table=InboxSeen._meta.db_table, fields=("source", "message_id"), time_column="received_at"
)


#: The fields a receive() sets; every other column is written with its default.
_VARYING = (
    "source",
    "message_id",
    "type",
    "payload",
    "headers",
    "key",
    "sequence",
    "correlation_id",
)


def _forgotten(using: str, source: str, message_id: str) -> bool:
    """A partitioned inbox remembers an id (``InboxSeen``) until the purge of the seen
    table, which may come after its message's partition was dropped. Such an id is
    forgotten here, as an unpartitioned inbox forgets it with the purged row: whether
    it was (and the insert may be tried again)."""
    if not partitions.is_partitioned(InboxMessage, using):
        return False
    if InboxMessage.objects.using(using).filter(source=source, message_id=message_id).exists():
        return False
    return partitions.forget_seen(InboxSeen, using, source, message_id)


def claim_id(using: str, source: str, message_id: str) -> bool:
    """Before a plain INSERT of a message (not ``receive()``'s): on a partitioned
    inbox, claim (*source*, *message_id*) in its seen table, ``False`` if a message
    has it already; elsewhere ``True`` (the unique index decides at the INSERT)."""
    if not partitions.is_partitioned(InboxMessage, using):
        return True
    for _ in range(2):
        if partitions.claim_seen(InboxSeen, using, source, message_id):
            return True
        if not _forgotten(using, source, message_id):
            return False
    return False


def _stored(using: str, source: str, message_id: str) -> InboxMessage:
    return InboxMessage.objects.using(using).get(source=source, message_id=message_id)


def _insert_with_savepoint(using: str, row: dict[str, Any]) -> InboxMessage | None:
    """MySQL/MariaDB: a plain INSERT in a savepoint; ``None`` for a duplicate."""
    try:
        # A savepoint: a duplicate must not break the caller's transaction.
        with transaction.atomic(using=using):
            message = InboxMessage.objects.using(using).create(
                **row, created_at=clock.now(), available_at=clock.now()
            )
    except IntegrityError:
        if (
            InboxMessage.objects.using(using)
            .filter(source=row["source"], message_id=row["message_id"])
            .exists()
        ):
            return None
        raise  # another constraint: a real error
    # MySQL cannot return the clock from the INSERT: read back what was stored.
    message.refresh_from_db(fields=["created_at", "available_at"])
    return message
