"""The webhook view: HTTP deliveries from another service's outbox (its ``http``
transport) into this service's inbox.

Include it once, ``path("inbox/", include("django_outbox.urls"))``; a sender
posts to ``inbox/<source>/``, where ``<source>`` is a ``webhook`` source
whose ``SECRET`` is the sender's. Answers:

- 200 ``{"status": "stored"}``: new, stored in the inbox (handled later);
- 200 ``{"status": "duplicate"}``: already stored (a retry): nothing else done;
- 400 malformed body or headers (a signed header's value that is not UTF-8 too),
  401 a missing, bad, stale or v1-only signature (v1 does not cover the envelope;
  accepted only with ``ACCEPT_V1``), 404 an unknown source, 405 not a POST, 413 a
  body over ``MAX_BODY_BYTES``: nothing stored, the reason in the JSON answer and
  in a WARNING log line;
- 503 the database failed: nothing stored, the sender retries.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from django_outbox import signing, tracing
from django_outbox.conf import SETTING_NAME, Source, get_settings
from django_outbox.exceptions import ConfigurationError, InvalidMessage
from django_outbox.inbox.api import receive
from django_outbox.inbox.intake import Arrival, Unreadable, parse
from django_outbox.wire import TRACE_HEADERS

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
    # The envelope is read from exactly the headers the signature covers: every
    # outbox-* header, Idempotency-Key and the source's mapped ones, as sent.
    # Host, User-Agent and the like are the HTTP exchange's, not the message's.
    wire = signing.wire_headers(request.headers)
    mapped = _mapped_headers(config)
    problem = _signature_problem(config, body, request.headers.get(signing.SIGNATURE_HEADER), wire)
    if problem:
        return _refuse(401, source, problem)
    # The signed bytes back to the text the sender wrote: our HTTP transport (and any
    # sender that writes non-ASCII header text) sends UTF-8. Read as the server decoded
    # them (Latin-1), a key "city:Zürich" would be stored as "city:ZÃ¼rich", another key
    # than the same message's over a broker.
    envelope = {}
    for name, value in signing.signed_headers(wire, also_cover=mapped):
        try:
            envelope[name.decode("latin-1")] = value.decode("utf-8")
        except UnicodeDecodeError:
            return _refuse(400, source, f"header {name.decode('latin-1')!r} is not UTF-8 text")
    idempotency_key = signing.IDEMPOTENCY_HEADER.lower()
    headers = {
        name: value for name, value in envelope.items() if name != idempotency_key or name in mapped
    }
    # The trace context too, unsigned: it decides nothing about the message, only which
    # trace its handler's span joins (see docs/operations.md, "Tracing").
    headers.update(
        (name, request.headers[name])
        for name in TRACE_HEADERS
        if name in request.headers and name not in headers
    )
    arrival = Arrival(
        source=config,
        body=body,
        headers=headers,
        transport_id=envelope.get(idempotency_key),
        content_type=request.content_type,
    )
    try:
        parsed = parse(arrival)
    except Unreadable as exc:
        return _refuse(400, source, str(exc))
    try:
        # No transaction of ours around it: receive() is one statement on PostgreSQL and
        # SQLite (INSERT … ON CONFLICT DO NOTHING, committed by itself) and takes its own
        # on MySQL; a BEGIN and a COMMIT would be two more round trips per delivery.
        with tracing.receiving(config, [arrival]):
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


def _mapped_headers(config: Source) -> set[str]:
    """The headers *config* reads the id, type, key and sequence from, if not ``outbox-*``."""
    return {config.header(role, "") for role in ("type", "key", "sequence", "message_id")} - {""}


def _signature_problem(
    config: Source, body: bytes, header: str | None, headers: dict[str, bytes]
) -> str:
    """Why the signature is not acceptable, or ``""``."""
    options = config.options
    tolerance = float(options.get("tolerance_seconds") or signing.DEFAULT_TOLERANCE_SECONDS)
    try:
        scheme = signing.check(
            str(options["secret"]),
            body,
            header,
            headers=headers,
            also_cover=_mapped_headers(config),
            tolerance=tolerance,
            accept_v1=bool(options.get("accept_v1")),
        )
    except signing.SignatureError as exc:
        if exc.kind == "v1":
            return (
                f"{exc} or set {SETTING_NAME}['INBOX']['SOURCES'][{config.name!r}]"
                "['ACCEPT_V1'] = True during a rolling upgrade"
            )
        return str(exc)
    if scheme == "v1":
        logger.info(
            "webhook %s: accepted a v1 signature (ACCEPT_V1); it does not cover the "
            "envelope: upgrade the sender, then remove ACCEPT_V1",
            config.name,
        )
    return ""
