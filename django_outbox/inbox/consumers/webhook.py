"""The webhook view: HTTP deliveries from another service's outbox (its ``http``
transport) into this service's inbox.

Include it once, ``path("inbox/", include("django_outbox.urls"))``; a sender
posts to ``inbox/<source>/``, where ``<source>`` is a ``webhook`` source
whose ``SECRET`` is the sender's. Answers:

- 200 ``{"status": "stored"}``: new, stored in the inbox (handled later);
- 200 ``{"status": "duplicate"}``: already stored (a retry): nothing else done;
- 400 malformed body or headers, 401 a bad or stale signature, 404 an unknown
  source, 405 not a POST, 413 a body over ``MAX_BODY_BYTES``: nothing stored,
  the reason in the JSON answer and in a WARNING log line;
- 503 the database failed: nothing stored, the sender retries.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from django_outbox import signing
from django_outbox.conf import get_settings
from django_outbox.exceptions import ConfigurationError, InvalidMessage
from django_outbox.inbox.api import receive
from django_outbox.inbox.intake import Arrival, Unreadable, parse

logger = logging.getLogger("django_outbox.inbox")


def _refuse(status: int, source: str, reason: str) -> JsonResponse:
    logger.warning("webhook %s refused (%d): %s", source, status, reason)
    return JsonResponse({"status": "refused", "reason": reason}, status=status)


@csrf_exempt
def webhook(request: HttpRequest, source: str) -> JsonResponse:
    """Store one signed delivery in the inbox (see the module's answers)."""
    if request.method != "POST":
        return JsonResponse({"status": "refused", "reason": "POST only"}, status=405)
    try:
        config = get_settings().inbox.source(source)
    except ConfigurationError:
        return _refuse(404, source, "unknown source")
    if config.transport != "webhook":
        return _refuse(404, source, f"source {source!r} does not take webhooks")
    length = request.META.get("CONTENT_LENGTH")
    if length and length.isdigit() and int(length) > config.max_body_bytes:
        return _refuse(413, source, f"body of {length} bytes is over {config.max_body_bytes}")
    body = request.body
    if len(body) > config.max_body_bytes:
        return _refuse(413, source, f"body of {len(body)} bytes is over {config.max_body_bytes}")
    signature = request.headers.get(signing.SIGNATURE_HEADER)
    problem = _signature_problem(config.options, body, signature)
    if problem:
        return _refuse(401, source, problem)
    # The message's own headers travel as outbox-* (or the source's mapped ones);
    # Host, User-Agent and the like are the HTTP exchange's, not the message's.
    mapped = {config.header(role, "") for role in ("type", "key", "sequence", "message_id")}
    headers: dict[str, Any] = {
        name: value
        for name, value in request.headers.items()
        if name.lower().startswith("outbox-") or name.lower() in mapped
    }
    headers.pop(signing.SIGNATURE_HEADER, None)
    arrival = Arrival(
        source=config,
        body=body,
        headers=headers,
        transport_id=request.headers.get("Idempotency-Key"),
        content_type=request.content_type,
    )
    try:
        parsed = parse(arrival)
    except Unreadable as exc:
        return _refuse(400, source, str(exc))
    try:
        with transaction.atomic():
            _, created = receive(
                parsed.type,
                parsed.payload,
                source=source,
                message_id=parsed.message_id,
                key=parsed.key,
                sequence=parsed.sequence,
                headers=parsed.headers,
                correlation_id=parsed.correlation_id,
            )
    except InvalidMessage as exc:
        return _refuse(400, source, str(exc))
    except DatabaseError:
        logger.exception("webhook %s: storing the message failed; the sender will retry", source)
        return JsonResponse({"status": "error", "reason": "database unavailable"}, status=503)
    return JsonResponse(
        {"status": "stored" if created else "duplicate", "message_id": parsed.message_id}
    )


def _signature_problem(options: Any, body: bytes, header: str | None) -> str:
    """Why the signature is not acceptable, or ``""``."""
    if not header:
        return f"no {signing.SIGNATURE_HEADER} header"
    tolerance = float(options.get("tolerance_seconds") or signing.DEFAULT_TOLERANCE_SECONDS)
    secret = str(options["secret"])
    if signing.verify(secret, body, header, tolerance=tolerance):
        return ""
    if signing.verify(secret, body, header, tolerance=float("inf")):
        return f"signature timestamp outside the {tolerance:g} s window (a replay or a clock)"
    return "bad signature"
