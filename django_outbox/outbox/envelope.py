"""What a transport publishes: a message detached from the database."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from json.encoder import encode_basestring as quote
from typing import TYPE_CHECKING, Any
from uuid import UUID

from django.core.serializers.json import DjangoJSONEncoder

from django_outbox.wire import (
    HEADER_ATTEMPT,
    HEADER_CORRELATION_ID,
    HEADER_CREATED_AT,
    HEADER_KEY,
    HEADER_MESSAGE_ID,
    HEADER_SEQUENCE,
    HEADER_TYPE,
    STANDARD_HEADERS,
)

if TYPE_CHECKING:
    from django_outbox.outbox.models import OutboxMessage


@dataclass(frozen=True, slots=True)
class Envelope:
    """One message as handed to a transport (no database access)."""

    message_id: UUID
    type: str
    destination: str
    payload: Any
    key: str | None = None
    sequence: int | None = None
    correlation_id: str | None = None
    created_at: datetime | None = None
    attempt: int = 1
    user_headers: Mapping[str, str] = field(default_factory=dict)
    #: The payload's JSON text as read from the database, when available.
    payload_json: str | None = None
    #: ``str(message_id)``, made once per message when the envelope is built from a row
    #: (the headers and the Redis transport's properties both need it).
    message_id_text: str | None = None

    @classmethod
    def from_message(cls, message: OutboxMessage) -> Envelope:
        """Build the envelope of an outbox row.

        A claimed row's payload is not decoded here. The envelope keeps its stored text
        (``payload_json``) and decodes it when ``payload`` is first read, as the row
        does (``KeptJSONField``): the Redis and RabbitMQ transports send the text and
        never pay for the decoding. The fields are stored straight into their slots
        (``__init__`` would need the payload)."""
        data = message.__dict__
        text = data.get("payload_json")
        message_id = message.message_id
        envelope = _new(cls)
        values = (
            message_id,
            message.type,
            message.destination,
            message.key,
            message.sequence,
            message.correlation_id,
            message.created_at,
            message.attempts,
            message.headers or {},
            text,
            str(message_id),
        )
        for store, value in zip(_STORE_ALL_BUT_PAYLOAD, values, strict=True):
            store(envelope, value)
        if text is None or "payload" in data:
            _store_payload(envelope, message.payload)
        return envelope

    if not TYPE_CHECKING:  # to type checkers, an unknown attribute stays an error

        def __getattr__(self, name: str) -> Any:
            # Only a slot never set gets here: the payload of an envelope made from a
            # claimed row, decoded from its text on first read.
            if name == "payload":
                from django_outbox.outbox.models import OutboxMessage

                value = OutboxMessage._meta.get_field("payload").decode_text(self.payload_json)
                _store_payload(self, value)
                return value
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def id_text(self) -> str:
        """The message id as text."""
        return self.message_id_text or str(self.message_id)

    @property
    def headers(self) -> dict[str, str]:
        """User headers plus the standard ``outbox-*`` headers, which win: a user header
        whose name is a standard one in any case is dropped (receivers read names
        case-blind, and HTTP cannot carry both)."""
        user = self.user_headers
        headers = (
            {str(k): str(v) for k, v in user.items() if str(k).lower() not in STANDARD_HEADERS}
            if user
            else {}
        )
        message_id = self.id_text()
        headers[HEADER_MESSAGE_ID] = message_id
        headers[HEADER_TYPE] = self.type
        headers[HEADER_CORRELATION_ID] = self.correlation_id or message_id
        headers[HEADER_ATTEMPT] = str(self.attempt)
        if self.key is not None:
            headers[HEADER_KEY] = self.key
            headers[HEADER_SEQUENCE] = str(self.sequence)
        if self.created_at is not None:
            headers[HEADER_CREATED_AT] = self.created_at.isoformat()
        return headers

    def headers_json(self) -> str:
        """``headers`` as the text of a JSON object, written directly.

        Without user headers, each value the standard headers may hold is quoted only
        where it can need it (a type, a key, a correlation id): the names are constant,
        the id is hex digits and dashes, the numbers digits and the time ISO 8601. On
        the Redis relay's path this halves the cost of the headers."""
        if self.user_headers:
            pairs = (f"{quote(k)}:{quote(v)}" for k, v in self.headers.items())
            return "{" + ",".join(pairs) + "}"
        message_id = self.id_text()
        text = (
            f'{{"{HEADER_MESSAGE_ID}":"{message_id}","{HEADER_TYPE}":{quote(self.type)},'
            f'"{HEADER_CORRELATION_ID}":{quote(self.correlation_id or message_id)},'
            f'"{HEADER_ATTEMPT}":"{self.attempt}"'
        )
        if self.key is not None:
            text += f',"{HEADER_KEY}":{quote(self.key)},"{HEADER_SEQUENCE}":"{self.sequence}"'
        if self.created_at is not None:
            text += f',"{HEADER_CREATED_AT}":"{self.created_at.isoformat()}"'
        return text + "}"

    def body(self) -> bytes:
        """The payload as UTF-8 JSON (the stored text when the claim kept it)."""
        if self.payload_json is not None:
            return self.payload_json.encode()
        return encode_json(self.payload)

    def body_text(self) -> str:
        """The payload as JSON text."""
        if self.payload_json is not None:
            return self.payload_json
        return encode_json(self.payload).decode()


_new = object.__new__
#: Each field's slot setter, in the fields' order (``from_message`` fills the slots).
_STORE = {f.name: getattr(Envelope, f.name).__set__ for f in fields(Envelope)}
_store_payload = _STORE.pop("payload")
_STORE_ALL_BUT_PAYLOAD = tuple(_STORE.values())


def encode_json(value: Any) -> bytes:
    """Compact JSON bytes, the same encoding ``send()`` validated."""
    return json.dumps(
        value, cls=DjangoJSONEncoder, separators=(",", ":"), ensure_ascii=False
    ).encode()
