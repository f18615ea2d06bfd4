"""The wire format both parts speak: what travels with every message.

The outbox writes these headers on every message it publishes (AMQP and
Redis message headers, HTTP headers, Celery task headers); the inbox reads
them back. The body is the payload as UTF-8 JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Header names (lower-case, protocol-neutral).
HEADER_MESSAGE_ID = "outbox-message-id"
HEADER_TYPE = "outbox-type"
HEADER_KEY = "outbox-key"
HEADER_SEQUENCE = "outbox-sequence"
HEADER_CORRELATION_ID = "outbox-correlation-id"
HEADER_CREATED_AT = "outbox-created-at"
HEADER_ATTEMPT = "outbox-attempt"
#: Set by ``send(reply_to=...)``: the source name the reply should come back to.
HEADER_REPLY_TO = "outbox-reply-to"

#: Headers that describe the message rather than travel with it as user headers.
STANDARD_HEADERS = frozenset(
    {
        HEADER_MESSAGE_ID,
        HEADER_TYPE,
        HEADER_KEY,
        HEADER_SEQUENCE,
        HEADER_CORRELATION_ID,
        HEADER_CREATED_AT,
        HEADER_ATTEMPT,
    }
)

#: Trace propagation headers: W3C Trace Context (``traceparent``, ``tracestate``), W3C
#: Baggage and Sentry's ``sentry-trace``. Every transport carries them like any header
#: of the message; the consumers that read only the ``outbox-*`` headers (the Celery task,
#: the webhook view) read these too. They are not signed: they decide nothing about the
#: message (see docs/operations.md, "Tracing").
TRACE_HEADERS = ("traceparent", "tracestate", "baggage", "sentry-trace")


def lower_keys(headers: Mapping[Any, Any] | None) -> dict[str, str]:
    """Headers with lower-case string names and string values (HTTP is case-blind)."""
    if not headers:
        return {}
    return {str(name).lower(): str(value) for name, value in headers.items() if value is not None}
