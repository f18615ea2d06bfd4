"""The webhook view: HTTP deliveries from another service's outbox (its ``http``
transport) into this service's inbox.

Include it once, ``path("inbox/", include("django_outbox.urls"))``; a sender
posts to ``inbox/<source>/``, where ``<source>`` is a ``webhook`` source
whose ``SECRET`` is the sender's. Answers:

- 200 ``{"status": "stored"}``: new, stored in the inbox (handled later; or, with the
  source's ``HANDLE_IN_REQUEST``, a sender's first attempt handled already, in the same
  transaction: see ``handled_here``);
- 200 ``{"status": "duplicate"}``: already stored (a retry): nothing else done;
- 400 malformed body or headers (a signed header's value that is not UTF-8 too),
  401 a missing, bad, stale or v1-only signature (v1 does not cover the envelope;
  accepted only with ``ACCEPT_V1``), 404 an unknown source, 405 not a POST, 413 a
  body over ``MAX_BODY_BYTES``: nothing stored, the reason in the JSON answer and
  in a WARNING log line;
- 503 the database failed: nothing stored, the sender retries.

A request signed as a batch (``b2=``, the ``http`` transport's ``BATCH``) carries
many messages: 200 ``{"status": "batch", "results": [...]}`` answers for each, in
order (``stored``, ``duplicate``, ``refused`` with a ``reason``, ``skipped`` behind
its key's refused one); a batch that cannot be read as a whole is 400, one over
``MAX_BATCH_BYTES`` 413, a bad signature 401, and nothing of it is stored.
"""

from __future__ import annotations

import json
import logging
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, router, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from django_outbox import metrics, signing, tracing
from django_outbox.conf import SETTING_NAME, Source, get_settings
from django_outbox.engine import triggers
from django_outbox.exceptions import ConfigurationError, InvalidMessage
from django_outbox.inbox.api import receive_many, receive_prepared
from django_outbox.inbox.handling import store_and_handle
from django_outbox.inbox.intake import (
    REFUSED,
    Arrival,
    Parsed,
    Unreadable,
    ordered_envelopes,
    parse,
)
from django_outbox.inbox.models import InboxMessage
from django_outbox.wire import HEADER_ATTEMPT, HEADER_KEY, HEADER_MESSAGE_ID, TRACE_HEADERS

logger = logging.getLogger("django_outbox.inbox")

#: A batch's largest body (``MAX_BATCH_BYTES``) and most messages (``MAX_BATCH``) by default.
DEFAULT_MAX_BATCH_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_BATCH = 1000


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
    signature = request.headers.get(signing.SIGNATURE_HEADER)
    batch = signing.is_batch(signature)
    limit = batch_bytes(config) if batch else config.max_body_bytes
    length = request.META.get("CONTENT_LENGTH")
    if length and length.isdigit() and int(length) > limit:
        return _refuse(413, source, f"body of {length} bytes is over {limit}")
    body = request.body
    if len(body) > limit:
        return _refuse(413, source, f"body of {len(body)} bytes is over {limit}")
    if batch:
        return _batch(config, body, signature)
    mapped = _mapped_headers(config)
    try:
        # The headers the signature covers, as sent, picked once: the check reads them.
        covered = signing.signed_headers(signing.wire_headers(request.headers), also_cover=mapped)
    except signing.SignatureError as exc:
        return _refuse(401, source, str(exc))
    problem = _signature_problem(config, mapped, body, signature, dict(covered))
    if problem:
        return _refuse(401, source, problem)
    # The signed bytes back to the text the sender wrote: our HTTP transport (and any
    # sender that writes non-ASCII header text) sends UTF-8. Read as the server decoded
    # them (Latin-1), a key "city:Zürich" would be stored as "city:ZÃ¼rich", another key
    # than the same message's over a broker.
    signed = {}
    for name, value in covered:
        try:
            signed[name.decode("latin-1")] = value.decode("utf-8")
        except UnicodeDecodeError:
            return _refuse(400, source, f"header {name.decode('latin-1')!r} is not UTF-8 text")
    arrival = _arrival(config, mapped, signed, request.headers, body, request.content_type)
    try:
        parsed = parse(arrival)
    except Unreadable as exc:
        return _refuse(400, source, str(exc))
    try:
        # No transaction of ours around it: the insert is one statement on PostgreSQL and
        # SQLite (INSERT … ON CONFLICT DO NOTHING, committed by itself) and takes its own
        # on MySQL; a BEGIN and a COMMIT would be two more round trips per delivery.
        with tracing.receiving(config, [arrival]):
            if handled_here(config, [arrival]):
                created = _store_and_handle_one(config, arrival, parsed)
            else:
                created = receive_prepared(parsed.prepared(source))
    except InvalidMessage as exc:
        return _refuse(400, source, str(exc))
    except DatabaseError:
        logger.exception("webhook %s: storing the message failed; the sender will retry", source)
        return JsonResponse({"status": "error", "reason": "database unavailable"}, status=503)
    return JsonResponse(
        {"status": "stored" if created else "duplicate", "message_id": parsed.message_id}
    )


def handled_here(config: Source, arrivals: Sequence[Arrival]) -> bool:
    """Whether *arrivals* (one delivery, or a batch's readable messages) are handled in
    the request: their source has ``HANDLE_IN_REQUEST`` and each is its sender's first
    attempt (a signed ``outbox-attempt: 1``). A retried delivery may be one whose handler
    killed the server before the commit: it is only stored, and the inbox's workers
    handle it through claims that count each attempt, so a poison message uses up its
    attempts instead of killing every server it is posted to. So is a delivery that
    does not say its attempt (a sender other than our ``http`` transport)."""
    return (
        config.handle_in_request
        and bool(arrivals)
        and all(arrival.headers.get(HEADER_ATTEMPT) == "1" for arrival in arrivals)
    )


def _store_and_handle_one(config: Source, arrival: Arrival, parsed: Parsed) -> bool:
    """Store one delivery and handle it in one transaction; whether it was new."""
    using = router.db_for_write(InboxMessage)
    prepared = parsed.prepared(config.name)
    (new, _), _, woken = store_and_handle(
        using,
        ordered_envelopes([arrival]),
        lambda: receive_many([prepared], using=using),
        rows=operator.itemgetter(0),
    )
    if woken:
        # Later messages of its key, stored before it, are due now: the workers take them.
        triggers.dispatch("inbox", using, [])
    metrics.counted("inbox", "received" if new else "duplicates", config.name)
    return bool(new)


def _arrival(
    config: Source,
    mapped: set[str],
    signed: Mapping[str, str],
    unsigned: Mapping[str, str],
    body: bytes,
    content_type: str | None,
) -> Arrival:
    """An arrival from a delivery's *signed* headers (lower-case names: every ``outbox-*``
    header, ``Idempotency-Key`` and the source's mapped ones, as sent) and the trace
    context among its *unsigned* ones; *mapped* is ``_mapped_headers(config)``."""
    idempotency_key = signing.IDEMPOTENCY_HEADER.lower()
    headers = {
        name: value for name, value in signed.items() if name != idempotency_key or name in mapped
    }
    # The trace context too, unsigned: it decides nothing about the message, only which
    # trace its handler's span joins (see docs/operations.md, "Tracing"). Host,
    # User-Agent and the like are the HTTP exchange's, not the message's.
    for name in TRACE_HEADERS:
        value = unsigned.get(name)
        if value is not None and name not in headers:
            headers[name] = value
    return Arrival(
        source=config,
        body=body,
        headers=headers,
        transport_id=signed.get(idempotency_key),
        content_type=content_type,
    )


def batch_bytes(config: Source) -> int:
    """The largest batch body *config* takes: ``MAX_BATCH_BYTES``."""
    return int(config.options.get("max_batch_bytes") or DEFAULT_MAX_BATCH_BYTES)


def _batch(config: Source, body: bytes, signature: str | None) -> JsonResponse:
    """Store a batch (the ``http`` transport's ``BATCH``). Each message of it is read
    and checked as a delivery of its own would be, and the readable ones are stored in
    one transaction (one statement on PostgreSQL and SQLite). A message that cannot be
    read is refused alone and stored nowhere; the later messages of its key in the batch
    are skipped, not stored (its sender holds the key behind the refused one)."""
    source = config.name
    options = config.options
    try:
        signing.check_batch(
            str(options["secret"]),
            body,
            signature,
            tolerance=float(options.get("tolerance_seconds") or signing.DEFAULT_TOLERANCE_SECONDS),
        )
    except signing.SignatureError as exc:
        return _refuse(401, source, str(exc))
    try:
        mapped = _mapped_headers(config)
        items = _batch_items(config, mapped, body)
    except Unreadable as exc:
        return _refuse(400, source, f"malformed batch: {exc}")
    key_header = config.header("key", HEADER_KEY)
    id_header = config.header("message_id", HEADER_MESSAGE_ID)
    results: list[dict[str, str]] = []
    readable: list[_Readable] = []
    refused_keys: set[str] = set()
    for position, (signed, unsigned, item_body) in enumerate(items):
        key = signed.get(key_header) or None
        results.append({"message_id": signed.get(id_header, ""), "status": "skipped"})
        if key is not None and key in refused_keys:
            continue
        arrival = _arrival(config, mapped, signed, unsigned, item_body, None)
        try:
            parsed = parse(arrival)
            readable.append(
                _Readable(
                    position,
                    arrival,
                    parsed,
                    parsed.prepared(source),
                )
            )
        except (Unreadable, InvalidMessage) as exc:
            logger.warning(
                "webhook %s refused message %s of a batch: %s",
                source,
                results[-1]["message_id"],
                exc,
            )
            results[-1].update(status="refused", reason=str(exc))
            if key is not None:
                refused_keys.add(key)
    using = router.db_for_write(InboxMessage)
    arrivals = [one.arrival for one in readable]
    try:
        with tracing.receiving(config, arrivals):
            new, handled, woken = _store_batch(
                readable, results, using, handle=handled_here(config, arrivals)
            )
    except DatabaseError:
        logger.exception("webhook %s: storing a batch failed; the sender will retry", source)
        return JsonResponse({"status": "error", "reason": "database unavailable"}, status=503)
    if (new and not handled) or woken:
        # Committed: wake the handlers as DISPATCH says (one NOTIFY, or one task), for
        # the new rows, or for messages of strict keys that handling here made due.
        triggers.dispatch("inbox", using, [] if handled else [row.pk for row in new])
    metrics.counted("inbox", "received", source, len(new))
    metrics.counted("inbox", "duplicates", source, sum(r["status"] == "duplicate" for r in results))
    return JsonResponse({"status": "batch", "results": results})


@dataclass(frozen=True)
class _Readable:
    """A message of a batch that could be read: its place, and ``receive()``'s arguments."""

    position: int
    arrival: Arrival
    parsed: Parsed
    prepared: tuple[dict[str, Any], str]


def _batch_items(
    config: Source, mapped: set[str], body: bytes
) -> list[tuple[dict[str, str], dict[str, str], bytes]]:
    """A batch body's messages: each one's signed headers (lower-case names, the ones a
    delivery of its own would have signed), all its headers, and its body's bytes. Raise
    ``Unreadable`` saying what is wrong with the batch as a whole."""
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise Unreadable(f"not UTF-8 JSON: {exc}") from exc
    except RecursionError:
        raise Unreadable("JSON nested too deeply to read") from None
    messages = document.get("messages") if isinstance(document, dict) else None
    if not isinstance(messages, list) or not messages:
        raise Unreadable('no "messages" list, or an empty one')
    most = int(config.options.get("max_batch") or DEFAULT_MAX_BATCH)
    if len(messages) > most:
        raise Unreadable(f"{len(messages)} messages, over MAX_BATCH ({most})")
    covered = mapped | {signing.IDEMPOTENCY_HEADER.lower()}
    items = []
    for position, message in enumerate(messages):
        headers = message.get("headers") if isinstance(message, dict) else None
        text = message.get("body") if isinstance(message, dict) else None
        if not isinstance(headers, dict) or not isinstance(text, str):
            raise Unreadable(f'message {position}: not {{"headers": {{…}}, "body": "…"}}')
        lowered: dict[str, str] = {}
        for name, value in headers.items():
            if not isinstance(value, str) or not _is_text(name) or not _is_text(value):
                raise Unreadable(f"message {position}: header {name!r} is not UTF-8 text")
            if name.lower() in lowered:
                raise Unreadable(f"message {position}: two headers named {name.lower()!r}")
            lowered[name.lower()] = value
        signed = {
            name: value
            for name, value in lowered.items()
            if name.startswith("outbox-") or name in covered
        }
        # A lone surrogate (JSON allows "\ud800") is kept as bytes that are not UTF-8:
        # that message alone is then refused as not UTF-8 JSON.
        items.append((signed, lowered, text.encode("utf-8", "surrogatepass")))
    return items


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _store_batch(
    readable: list[_Readable], results: list[dict[str, str]], using: str, *, handle: bool
) -> tuple[list[Any], bool, bool]:
    """Store the readable messages of a batch in one transaction (with *handle*, and
    handle the new ones in it) and note in *results* which were new and which duplicates.
    Return the new rows, whether they were handled here, and whether handling made other
    messages of strict keys due. If the database refuses a value of the batch, store them
    one by one, each in a transaction of its own, for the workers to handle: the one
    refused is refused alone (with the database's error), and its key's later ones
    skipped."""
    handled = woken = False
    try:
        prepared = [one.prepared for one in readable]
        if handle:
            (new, _), _, woken = store_and_handle(
                using,
                ordered_envelopes([one.arrival for one in readable]),
                lambda: receive_many(prepared, using=using),
                rows=operator.itemgetter(0),
            )
            handled = True
        else:
            with transaction.atomic(using=using):
                new, _ = receive_many(prepared, using=using)
        stored = readable
    except REFUSED as exc:
        logger.warning(
            "the database refused a batch of %d message(s) (%s); storing them one by one",
            len(readable),
            type(exc).__name__,
        )
        new, stored, refused_keys = [], [], set()
        for one in readable:
            key = one.parsed.key
            if key is not None and key in refused_keys:
                continue
            try:
                with transaction.atomic(using=using):
                    rows, _ = receive_many([one.prepared], using=using)
            except REFUSED as error:
                reason = f"cannot be stored: {type(error).__name__}: {error}".strip()
                results[one.position].update(status="refused", reason=reason)
                if key is not None:
                    refused_keys.add(key)
                continue
            new += rows
            stored.append(one)
    created = {row.message_id for row in new}
    for one in stored:
        message_id = one.parsed.message_id
        results[one.position]["message_id"] = message_id
        # The same id twice in one batch: the first is the one stored.
        results[one.position]["status"] = "stored" if message_id in created else "duplicate"
        created.discard(message_id)
    return new, handled, woken


def _mapped_headers(config: Source) -> set[str]:
    """The headers *config* reads the id, type, key and sequence from, if not ``outbox-*``."""
    return set(config.mapped_headers.values())


def _signature_problem(
    config: Source,
    mapped: set[str],
    body: bytes,
    header: str | None,
    headers: Mapping[bytes, bytes],
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
            also_cover=mapped,
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
