"""Intake: a message as it arrives from a source (bytes and headers) into the inbox.

Every consumer (the kombu command, the Celery task, the webhook view, the
local transport) reads a message into an :class:`Arrival`, and
:func:`store` turns it into a ``receive()`` call. What cannot be read (no
id, no type, a body that is not JSON, over the size limit, of another
content type, a sequence that is not a number) is not dropped: it is stored
as ``handle_error`` with its raw body and the reason, so an operator sees
it, and the consumer acknowledges it. The webhook view refuses such
requests instead (the sender gets a 4xx and can fix them).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import router

from django_outbox.conf import Source
from django_outbox.engine import clock
from django_outbox.exceptions import InvalidMessage
from django_outbox.inbox.api import prepare, receive, receive_many
from django_outbox.inbox.models import InboxMessage, InboxState
from django_outbox.wire import (
    HEADER_CORRELATION_ID,
    HEADER_KEY,
    HEADER_MESSAGE_ID,
    HEADER_SEQUENCE,
    HEADER_TYPE,
    STANDARD_HEADERS,
    lower_keys,
)

logger = logging.getLogger("django_outbox.inbox")

#: Content types read as JSON (a missing content type is read as JSON too).
JSON_TYPES = ("application/json", "text/plain", "application/x-json")


class Unreadable(Exception):
    """An arrival that cannot become a message; the text says why."""


@dataclass(frozen=True)
class Arrival:
    """One message as a source delivered it."""

    source: Source
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    #: The transport's own message id (AMQP ``message_id``, Celery task id), if any.
    transport_id: str | None = None
    content_type: str | None = None


@dataclass(frozen=True)
class Parsed:
    """The arguments of ``receive()`` read from an arrival."""

    type: str
    payload: Any
    message_id: str
    key: str | None
    sequence: int | None
    correlation_id: str | None
    headers: dict[str, str]


def parse(arrival: Arrival) -> Parsed:
    """Read *arrival*; raise ``Unreadable`` saying why it cannot be a message."""
    source = arrival.source
    headers = lower_keys(arrival.headers)
    if len(arrival.body) > source.max_body_bytes:
        raise Unreadable(
            f"body of {len(arrival.body)} bytes is over the limit of {source.max_body_bytes}"
        )
    content_type = (arrival.content_type or "").split(";")[0].strip().lower()
    if content_type and content_type not in JSON_TYPES:
        raise Unreadable(f"content type {content_type!r} is not JSON")
    message_id = headers.get(source.header("message_id", HEADER_MESSAGE_ID)) or arrival.transport_id
    if not message_id:
        raise Unreadable("no message id (header or transport property)")
    message_type = headers.get(source.header("type", HEADER_TYPE)) or source.options.get(
        "default_type"
    )
    if not message_type:
        raise Unreadable("no message type (header, or DEFAULT_TYPE of the source)")
    try:
        payload = json.loads(arrival.body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Unreadable(f"body is not UTF-8 JSON: {exc}") from exc
    key = headers.get(source.header("key", HEADER_KEY)) or None
    raw_sequence = headers.get(source.header("sequence", HEADER_SEQUENCE))
    sequence = None
    if raw_sequence not in (None, "", "None"):
        try:
            sequence = int(str(raw_sequence))
        except ValueError:
            raise Unreadable(f"sequence {raw_sequence!r} is not an integer") from None
    if key is None:
        sequence = None
    return Parsed(
        type=str(message_type),
        payload=payload,
        message_id=str(message_id),
        key=key,
        sequence=sequence,
        correlation_id=headers.get(HEADER_CORRELATION_ID) or None,
        headers={k: v for k, v in headers.items() if k not in STANDARD_HEADERS},
    )


def store(
    arrival: Arrival, *, using: str | None = None, trigger: bool = True
) -> tuple[InboxMessage, bool]:
    """``receive()`` *arrival*, or store it as ``handle_error`` with its raw body and the
    reason if it cannot be read. Returns ``(row, created)`` like ``receive()``."""
    try:
        parsed = parse(arrival)
        return receive(
            parsed.type,
            parsed.payload,
            source=arrival.source.name,
            message_id=parsed.message_id,
            key=parsed.key,
            sequence=parsed.sequence,
            headers=parsed.headers,
            correlation_id=parsed.correlation_id,
            using=using,
            trigger=trigger,
        )
    except (Unreadable, InvalidMessage) as exc:
        return store_unreadable(arrival, str(exc), using=using)


def store_unreadable(
    arrival: Arrival, reason: str, *, using: str | None = None
) -> tuple[InboxMessage, bool]:
    """Keep an unreadable arrival as ``handle_error`` (once: the same bytes redelivered
    find the same row)."""
    source = arrival.source
    headers = lower_keys(arrival.headers)
    message_id = (
        headers.get(source.header("message_id", HEADER_MESSAGE_ID))
        or arrival.transport_id
        or "sha256:" + hashlib.sha256(arrival.body).hexdigest()
    )[:255]
    kept = arrival.body[: source.max_body_bytes]
    raw = kept.decode("utf-8", "backslashreplace").replace("\x00", "\\x00")
    if len(kept) < len(arrival.body):
        raw += f"\n[… {len(arrival.body) - len(kept)} more bytes not kept]"
    using = using or router.db_for_write(InboxMessage)
    message, created = InboxMessage.objects.using(using).get_or_create(
        source=source.name,
        message_id=message_id,
        defaults={
            "type": (headers.get(source.header("type", HEADER_TYPE)) or "unreadable")[:255],
            "payload": None,
            "headers": {k: v[:1000] for k, v in list(headers.items())[:50]},
            "state": InboxState.HANDLE_ERROR,
            "raw_body": raw,
            "last_error": f"unreadable: {reason}"[:4000],
            "created_at": clock.now(),
            "available_at": clock.now(),
        },
    )
    if created:
        logger.warning(
            "unreadable message from %s kept as handle_error (id %s): %s",
            source.name,
            message_id,
            reason,
        )
        message.refresh_from_db()
    return message, created


@dataclass
class Stored:
    """What ``store_many`` did with a batch."""

    #: The new messages (to handle).
    rows: list[InboxMessage] = field(default_factory=list)
    duplicates: int = 0
    unreadable: int = 0

    @property
    def ids(self) -> list[int]:
        return [row.pk for row in self.rows]


def store_many(arrivals: Sequence[Arrival], *, using: str | None = None) -> Stored:
    """Store a batch of arrivals (``inbox_consume``): readable ones in one multi-row
    INSERT where the database allows, unreadable ones kept one by one. No triggers."""
    stored = Stored()
    prepared = []
    for arrival in arrivals:
        try:
            parsed = parse(arrival)
            prepared.append(
                prepare(
                    parsed.type,
                    parsed.payload,
                    source=arrival.source.name,
                    message_id=parsed.message_id,
                    key=parsed.key,
                    sequence=parsed.sequence,
                    headers=parsed.headers,
                    correlation_id=parsed.correlation_id,
                )
            )
        except (Unreadable, InvalidMessage) as exc:
            _, created = store_unreadable(arrival, str(exc), using=using)
            if created:
                stored.unreadable += 1
            else:
                stored.duplicates += 1
    stored.rows, duplicates = receive_many(prepared, using=using)
    stored.duplicates += duplicates
    return stored
