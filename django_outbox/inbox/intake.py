"""Intake: a message as it arrives from a source (bytes and headers) into the inbox.

Every consumer (the kombu command, the Celery task, the webhook view, the
local transport) reads a message into an :class:`Arrival`, and
:func:`store` turns it into a ``receive()`` call. What cannot be read (no
id, no type, a body that is not JSON, over the size limit, of another
content type, a sequence that is not a number) is not dropped: it is stored
as ``handle_error`` with its raw body and the reason, so an operator sees
it, and the consumer acknowledges it. The webhook view refuses such
requests instead (the sender gets a 4xx and can fix them).

The values of such a message are kept escaped (control characters as
``\\xNN``), so that every database stores them: PostgreSQL refuses a NUL in
any text. If the database still refuses a batch (a value no check here
foresaw), the messages are stored one by one, and the one refused is kept as
unreadable with the database's error. Only a message refused even in that
form is left out (``Unstorable``); its consumer logs it at ERROR with its
body's hash and gives it up rather than retry it forever.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import DataError, IntegrityError, router, transaction

from django_outbox import tracing
from django_outbox.conf import Source
from django_outbox.engine import clock, partitions
from django_outbox.exceptions import InvalidMessage
from django_outbox.inbox.api import (
    MAX_KEY_LENGTH,
    MAX_SOURCE_LENGTH,
    claim_id,
    prepare,
    receive,
    receive_many,
)
from django_outbox.inbox.models import InboxMessage, InboxState
from django_outbox.validation import check_text, escape_control, storable
from django_outbox.wire import (
    HEADER_CORRELATION_ID,
    HEADER_KEY,
    HEADER_MESSAGE_ID,
    HEADER_TYPE,
    STANDARD_HEADERS,
    lower_keys,
)

logger = logging.getLogger("django_outbox.inbox")

#: Content types read as JSON (a missing content type is read as JSON too).
JSON_TYPES = ("application/json", "text/plain", "application/x-json")


class _NotPlain(Exception):
    """A body holds what a stored payload may not (``NaN``, an infinity, a number too
    large for a float: ``prepare()`` says why, in the same words as for ``receive()``),
    or a number whose text the database would keep otherwise than its encoding."""


def _not_plain(_: str) -> Any:
    raise _NotPlain


def _finite(literal: str) -> float:
    # An exponent too: "1E5" would be stored as the number 100000, read back an int,
    # where encoding the float stores 100000.0.
    if "e" in literal or "E" in literal:
        raise _NotPlain
    value = float(literal)
    if value - value != 0.0:  # inf - inf is nan
        raise _NotPlain
    return value


#: Decodes a body whose text can be stored as it is: it refuses what the checked
#: encoding of ``prepare()`` would (those bodies are decoded again the usual way).
_PLAIN_DECODER = json.JSONDecoder(parse_constant=_not_plain, parse_float=_finite)

#: What a database raises when it refuses the values of a message (a NUL, a number out
#: of range, a constraint; the driver's encoding errors are ValueErrors), as opposed to
#: being unreachable or misconfigured: the message stored another way may succeed,
#: retrying it as it is never will.
REFUSED = (DataError, IntegrityError, ValueError)


class Unreadable(Exception):
    """An arrival that cannot become a message; the text says why."""


class Unstorable(Exception):
    """An arrival the database refused even as unreadable; the text names it (source, id,
    the body's SHA-256) and the database's error."""

    def __init__(self, arrival: Arrival, error: BaseException) -> None:
        digest = hashlib.sha256(arrival.body).hexdigest()
        message_id = (
            lower_keys(arrival.headers).get(arrival.source.header("message_id", HEADER_MESSAGE_ID))
            or arrival.transport_id
        )
        super().__init__(
            f"message {escape_control(str(message_id or '(no id)'))[:255]} from "
            f"{arrival.source.name} (body sha256:{digest}, {len(arrival.body)} bytes) could "
            f"not be stored, not even as unreadable: {_error_text(error)}"
        )
        self.arrival = arrival


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
    #: The body's JSON text, when it can be stored as it was sent: it decoded to the
    #: payload, and holds nothing ``prepare()``'s encoding would refuse or write another
    #: way (no ``NaN``, infinity or escape sequence; not ``null``). ``None``: the payload
    #: is encoded and checked again.
    text: str | None = None

    def prepared(
        self, source: str, context: Mapping[str, str] | None = None
    ) -> tuple[dict[str, Any], str]:
        """``prepare()`` of this message from *source* (its payload decoded already;
        *context* as ``prepare()`` takes it), or raise ``InvalidMessage``."""
        return prepare(
            self.type,
            self.payload,
            source=source,
            decoded=True,
            text=self.text,
            context=context,
            **self.arguments(),
        )

    def arguments(self) -> dict[str, Any]:
        """``receive()``'s (and ``prepare()``'s) keyword arguments but ``source``."""
        return {
            "message_id": self.message_id,
            "key": self.key,
            "sequence": self.sequence,
            "headers": self.headers,
            "correlation_id": self.correlation_id,
        }


def parse(arrival: Arrival) -> Parsed:
    """Read *arrival*; raise ``Unreadable`` saying why it cannot be a message."""
    source = arrival.source
    headers = lower_keys(arrival.headers)
    if len(arrival.body) > source.max_body_bytes:
        raise Unreadable(
            f"body of {len(arrival.body)} bytes is over the limit of {source.max_body_bytes}"
        )
    content_type = arrival.content_type
    if content_type and content_type not in JSON_TYPES:  # as sent, usually: no parsing
        content_type = content_type.split(";")[0].strip().lower()
        if content_type and content_type not in JSON_TYPES:
            raise Unreadable(f"content type {content_type!r} is not JSON")
    id_header, type_header, key_header, sequence_header = source.envelope_headers
    message_id = headers.get(id_header) or arrival.transport_id
    if not message_id:
        raise Unreadable("no message id (header or transport property)")
    message_type = headers.get(type_header) or source.options.get("default_type")
    if not message_type:
        raise Unreadable("no message type (header, or DEFAULT_TYPE of the source)")
    text: str | None = None
    try:
        text = arrival.body.decode("utf-8")
        try:
            if text.startswith("\ufeff"):
                raise _NotPlain  # json.loads says what is wrong with it
            payload = _PLAIN_DECODER.decode(text)
        except _NotPlain:
            payload = json.loads(text)
            text = None
    except (UnicodeDecodeError, ValueError) as exc:
        raise Unreadable(f"body is not UTF-8 JSON: {exc}") from exc
    except RecursionError:
        raise Unreadable("body is JSON nested too deeply to read") from None
    if text is not None and (payload is None or "\\u" in text):
        text = None  # escapes (a NUL, a lone surrogate) and null: prepare() checks them
    key = headers.get(key_header) or None
    raw_sequence = headers.get(sequence_header)
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
        text=text,
    )


def ordered_envelopes(arrivals: Sequence[Arrival]) -> Iterator[tuple[str, str, str]]:
    """``(source, type, key)`` of each arrival that names a valid key, read from its
    headers alone (the body is not parsed): what ``inbox_consume`` creates the cursors
    of before its batch's transaction. An arrival found unreadable later only leaves an
    unused cursor. Read as they are asked for: only MySQL/MariaDB asks
    (``handling.store_and_handle``)."""
    for arrival in arrivals:
        source = arrival.source
        headers = lower_keys(arrival.headers)
        key = headers.get(source.header("key", HEADER_KEY)) or None
        message_type = headers.get(source.header("type", HEADER_TYPE)) or source.options.get(
            "default_type"
        )
        if key is None or not message_type:
            continue
        try:
            check_text("key", key, MAX_KEY_LENGTH)
            check_text("source", source.name, MAX_SOURCE_LENGTH)
        except InvalidMessage:
            continue
        yield source.name, str(message_type), key


def store(
    arrival: Arrival, *, using: str | None = None, trigger: bool = True
) -> tuple[InboxMessage, bool]:
    """Store *arrival* in a transaction of its own: ``receive()`` it, or keep it as
    ``handle_error`` with its raw body and the reason if it cannot be read or the
    database refuses its values. Returns ``(row, created)`` like ``receive()``.

    Raises ``Unstorable`` if the database refuses it even as unreadable, and the
    database's other errors (unreachable, deadlocked): nothing is stored then.
    """
    using = using or router.db_for_write(InboxMessage)
    try:
        with transaction.atomic(using=using):
            return _store_one(arrival, using=using, trigger=trigger)
    except REFUSED as exc:
        return _keep_refused(arrival, exc, using=using)


def _store_one(arrival: Arrival, *, using: str, trigger: bool) -> tuple[InboxMessage, bool]:
    try:
        parsed = parse(arrival)
        return receive(
            parsed.type,
            parsed.payload,
            source=arrival.source.name,
            using=using,
            trigger=trigger,
            **parsed.arguments(),
        )
    except (Unreadable, InvalidMessage) as exc:
        return store_unreadable(arrival, str(exc), using=using)


def _keep_refused(
    arrival: Arrival, error: BaseException, *, using: str
) -> tuple[InboxMessage, bool]:
    """Keep an arrival whose values the database refused as unreadable, with the
    database's error, in a transaction (or savepoint) of its own."""
    try:
        with transaction.atomic(using=using):
            return store_unreadable(arrival, f"cannot be stored: {_error_text(error)}", using=using)
    except REFUSED as exc:
        raise Unstorable(arrival, exc) from exc


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".strip()


def store_unreadable(
    arrival: Arrival, reason: str, *, using: str | None = None
) -> tuple[InboxMessage, bool]:
    """Keep an unreadable arrival as ``handle_error`` (once: the same bytes redelivered
    find the same row). Its id, type and headers are kept with control characters
    escaped, its body as text with undecodable bytes and NULs escaped."""
    source = arrival.source
    headers = lower_keys(arrival.headers)
    message_id = escape_control(
        headers.get(source.header("message_id", HEADER_MESSAGE_ID))
        or arrival.transport_id
        or "sha256:" + hashlib.sha256(arrival.body).hexdigest()
    )[:255]
    kept = arrival.body[: source.max_body_bytes]
    raw = storable(kept.decode("utf-8", "backslashreplace"))
    if len(kept) < len(arrival.body):
        raw += f"\n[… {len(arrival.body) - len(kept)} more bytes not kept]"
    message_type = headers.get(source.header("type", HEADER_TYPE)) or "unreadable"
    using = using or router.db_for_write(InboxMessage)
    message, created = _get_or_create(
        using,
        source.name,
        message_id,
        {
            "type": escape_control(message_type)[:255],
            "payload": None,
            "headers": {
                escape_control(k)[:255]: escape_control(v)[:1000]
                for k, v in list(headers.items())[:50]
            },
            "state": InboxState.HANDLE_ERROR,
            "raw_body": raw,
            "last_error": storable(f"unreadable: {reason}")[:4000],
            "created_at": clock.now(),
            "available_at": clock.now(),
        },
    )
    if created:
        logger.warning(
            "unreadable message from %s kept as handle_error (id %s): %s",
            source.name,
            message_id,
            storable(reason),
        )
        message.refresh_from_db()
    return message, created


def _get_or_create(
    using: str, source: str, message_id: str, defaults: dict[str, Any]
) -> tuple[InboxMessage, bool]:
    """``get_or_create`` by (source, message id); a partitioned inbox, which has no
    unique index of them, claims the id in its seen table first."""
    messages = InboxMessage.objects.using(using)
    if not partitions.is_partitioned(InboxMessage, using):
        return messages.get_or_create(source=source, message_id=message_id, defaults=defaults)
    if claim_id(using, source, message_id):
        return messages.create(source=source, message_id=message_id, **defaults), True
    return messages.get(source=source, message_id=message_id), False


@dataclass
class Stored:
    """What ``store_many`` or ``store_each`` did with a batch."""

    #: The new messages (to handle).
    rows: list[InboxMessage] = field(default_factory=list)
    duplicates: int = 0
    unreadable: int = 0
    #: Arrivals refused even as unreadable, by their position in the batch.
    refused: dict[int, Unstorable] = field(default_factory=dict)

    @property
    def ids(self) -> list[int]:
        return [row.pk for row in self.rows]


def store_many(arrivals: Sequence[Arrival], *, using: str | None = None) -> Stored:
    """Store a batch of arrivals (``inbox_consume``): readable ones in one multi-row
    INSERT where the database allows, unreadable ones kept one by one. No triggers.

    Raises what the database raises; one of ``REFUSED`` means it refused a value of
    the batch, and the caller's transaction must be rolled back: ``store_each`` then
    stores the batch without the message at fault holding back the others.
    """
    stored = Stored()
    prepared = []
    context = tracing.context_headers() if tracing.enabled() else None
    for arrival in arrivals:
        try:
            prepared.append(parse(arrival).prepared(arrival.source.name, context))
        except (Unreadable, InvalidMessage) as exc:
            _, created = store_unreadable(arrival, str(exc), using=using)
            if created:
                stored.unreadable += 1
            else:
                stored.duplicates += 1
    stored.rows, duplicates = receive_many(prepared, using=using)
    stored.duplicates += duplicates
    return stored


def store_each(arrivals: Sequence[Arrival], *, using: str | None = None) -> Stored:
    """Store a batch the database refused, one arrival at a time, each in a savepoint:
    a refused arrival is kept as unreadable with the database's error, and one refused
    even so is left out (``Stored.refused``). Costs two more round trips a message."""
    using = using or router.db_for_write(InboxMessage)
    stored = Stored()
    for position, arrival in enumerate(arrivals):
        try:
            with transaction.atomic(using=using):
                one = store_many([arrival], using=using)
        except REFUSED as exc:
            try:
                _, created = _keep_refused(arrival, exc, using=using)
            except Unstorable as unstorable:
                stored.refused[position] = unstorable
                continue
            stored.unreadable += created
            stored.duplicates += not created
            continue
        stored.rows += one.rows
        stored.duplicates += one.duplicates
        stored.unreadable += one.unreadable
    return stored
