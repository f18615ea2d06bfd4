"""HMAC-SHA256 signatures for HTTP deliveries, over the body *and* the envelope.

Guarantee: a request signed with the shared secret cannot be changed in
anything that decides dedup, routing or order (message id, type, key,
sequence, correlation id, reply-to, any other ``outbox-*`` header,
``Idempotency-Key``) or in its body without the receiver noticing, and it
is accepted only within ``tolerance`` seconds of its timestamp. Within that
window the exact request can be replayed, and the inbox stores it once (same
message id). Mechanism and price: one HMAC over a few hundred bytes per
request, and a sender and a receiver that agree on which headers are signed.

The header is ``Outbox-Signature: t=<unix seconds>,v2=<hex digest>``. The
digest is HMAC-SHA256, under the shared secret, of the concatenation of
these netstrings (``<decimal byte length>:<bytes>,``, so no two different
inputs encode alike):

1. ``outbox-v2`` (the scheme's name, so a v2 input is never a v1 one);
2. the timestamp, decimal ASCII digits, exactly as in ``t=``;
3. the number *n* of signed headers, decimal ASCII digits;
4. *n* pairs, sorted by name: the header's name with ASCII letters in lower
   case (HTTP names are case-blind), then its value, the bytes as sent;
5. the body, the bytes as sent.

The signed headers are every header the request carries whose name starts
with ``outbox-`` (except ``Outbox-Signature`` itself), ``Idempotency-Key``
when present, and any header a receiving source maps to the id, type, key or
sequence (``also_cover``). A header that is absent is not listed; one sent
with an empty value is listed with an empty value: the two sign differently.
Adding or removing such a header changes *n* and the pairs.

``b2=`` signs a batch (the ``http`` transport's ``BATCH``): one request whose JSON
body carries many messages, each with its own ``outbox-*`` headers inside the body.
Its digest is the v2 digest with ``outbox-batch-v2`` as the scheme's name and no
signed headers (the body holds them all). The different name keeps the two kinds
apart: a request signed as one message can never be read as a batch, nor a batch
as one message, whatever its body or its other headers say.

``v1=`` (HMAC-SHA256 of ``b"<t>." + body``, the scheme before) covers the body
only: a captured request replays under a new message id. It is refused
unless the receiver passes ``accept_v1=True``; senders never write it.

This module uses only the standard library, so a receiver without
django-outbox can copy it.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterable, Mapping

SIGNATURE_HEADER = "Outbox-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"
DEFAULT_TOLERANCE_SECONDS = 300
#: The first netstring of every v2 input.
SCHEME_V2 = b"outbox-v2"
#: The first netstring of every batch input (``b2=``).
SCHEME_BATCH = b"outbox-batch-v2"
#: Signed headers are those whose lower-case name starts with this.
SIGNED_PREFIX = b"outbox-"

_SIGNATURE_NAME = SIGNATURE_HEADER.lower().encode()
_IDEMPOTENCY_NAME = IDEMPOTENCY_HEADER.lower().encode()

HeaderValue = str | bytes
#: Headers by name: text (a request's, ``str`` values taken as UTF-8) or the bytes sent.
Headers = Mapping[str, HeaderValue] | Mapping[bytes, bytes]


class SignatureError(ValueError):
    """A signature that is not acceptable; the text says why, ``kind`` says which case.

    Kinds: ``missing`` (no header), ``malformed`` (no ``t=`` or no digest),
    ``headers`` (two headers whose names differ only in case), ``v1`` (only a
    v1 digest and v1 not accepted), ``bad`` (no digest matches), ``stale``
    (the digest matches but the timestamp is outside the tolerance).
    """

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _bytes(value: HeaderValue) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8")


def _netstring(data: bytes) -> bytes:
    return b"%d:%s," % (len(data), data)


def signed_headers(
    headers: Headers, *, also_cover: Iterable[str] = ()
) -> list[tuple[bytes, bytes]]:
    """The headers a v2 signature covers: ``(lower-case name, value)`` bytes, sorted by name.

    Values given as ``str`` are taken as UTF-8; pass ``bytes`` for the exact
    bytes on the wire (see :func:`wire_headers`). Raises ``SignatureError``
    (kind ``headers``) when two covered names differ only in case.
    """
    extra = {_bytes(name).lower() for name in also_cover}
    covered: dict[bytes, bytes] = {}
    for name, value in headers.items():
        key = _bytes(name).lower()
        if key == _SIGNATURE_NAME:
            continue
        if key.startswith(SIGNED_PREFIX) or key == _IDEMPOTENCY_NAME or key in extra:
            if key in covered:
                raise SignatureError(
                    f"two headers named {key.decode('latin-1')!r} (names differ only in "
                    "case, which HTTP does not keep apart)",
                    "headers",
                )
            covered[key] = _bytes(value)
    return sorted(covered.items())


def canonical(
    timestamp: int,
    headers: Headers,
    body: bytes,
    *,
    also_cover: Iterable[str] = (),
    scheme: bytes = SCHEME_V2,
) -> bytes:
    """The bytes a v2 (or, with *scheme*, a batch) digest is computed over (see the
    module's docstring)."""
    pairs = signed_headers(headers, also_cover=also_cover)
    parts = [_netstring(scheme), _netstring(b"%d" % timestamp), _netstring(b"%d" % len(pairs))]
    for name, value in pairs:
        parts += [_netstring(name), _netstring(value)]
    parts.append(_netstring(body))
    return b"".join(parts)


def _key(secret: str | bytes) -> bytes:
    return secret.encode() if isinstance(secret, str) else secret


def _digest_v2(
    secret: str | bytes,
    timestamp: int,
    headers: Headers,
    body: bytes,
    also_cover: Iterable[str],
) -> str:
    message = canonical(timestamp, headers, body, also_cover=also_cover)
    return hmac.new(_key(secret), message, hashlib.sha256).hexdigest()


def _digest_batch(secret: str | bytes, timestamp: int, body: bytes) -> str:
    message = canonical(timestamp, {}, body, scheme=SCHEME_BATCH)
    return hmac.new(_key(secret), message, hashlib.sha256).hexdigest()


def _digest_v1(secret: str | bytes, timestamp: int, body: bytes) -> str:
    return hmac.new(_key(secret), b"%d." % timestamp + body, hashlib.sha256).hexdigest()


def sign(
    secret: str | bytes,
    body: bytes,
    *,
    headers: Headers,
    also_cover: Iterable[str] = (),
    timestamp: int | None = None,
) -> str:
    """The ``Outbox-Signature`` value (``t=…,v2=…``) for *body* and *headers* at *timestamp*
    (default now). *headers* are those the request carries (at least its signed ones);
    *also_cover* names headers the receiving source maps (``KEY_HEADER`` …)."""
    if not secret:
        raise ValueError("a signing secret is required")
    ts = int(time.time()) if timestamp is None else int(timestamp)
    try:
        digest = _digest_v2(secret, ts, headers, body, also_cover)
    except SignatureError as exc:
        raise ValueError(str(exc)) from None
    return f"t={ts},v2={digest}"


def sign_batch(secret: str | bytes, body: bytes, *, timestamp: int | None = None) -> str:
    """The ``Outbox-Signature`` value (``t=…,b2=…``) of a batch request's *body*."""
    if not secret:
        raise ValueError("a signing secret is required")
    ts = int(time.time()) if timestamp is None else int(timestamp)
    return f"t={ts},b2={_digest_batch(secret, ts, body)}"


def is_batch(header: str | None) -> bool:
    """Whether the ``Outbox-Signature`` value *header* signs a batch (has a ``b2=`` digest).
    Only says which check to make: :func:`check_batch` decides whether it holds."""
    return bool(header) and bool(_parse(str(header)).get("b2"))


def check_batch(
    secret: str | bytes,
    body: bytes,
    header: str | None,
    *,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> None:
    """Raise ``SignatureError`` unless *header*'s ``b2=`` digest signs the batch *body*
    within *tolerance* seconds of *now*."""
    parts, ts = _read(secret, header)
    if not parts.get("b2"):
        raise SignatureError(f"malformed {SIGNATURE_HEADER} header: no b2= digest", "malformed")
    _compare(_digest_batch(secret, ts, body), parts["b2"], ts, tolerance, now)


def _read(secret: str | bytes, header: str | None) -> tuple[dict[str, list[str]], int]:
    """*header*'s items by name and its timestamp; raise ``SignatureError`` (``missing``,
    ``malformed``) when it has none."""
    if not secret:
        raise ValueError("a signing secret is required")
    if not header:
        raise SignatureError(f"no {SIGNATURE_HEADER} header", "missing")
    parts = _parse(header)
    try:
        return parts, int(parts["t"][0])
    except (KeyError, ValueError):
        raise SignatureError(
            f"malformed {SIGNATURE_HEADER} header: no t=<unix seconds>", "malformed"
        ) from None


def _parse(header: str) -> dict[str, list[str]]:
    parts: dict[str, list[str]] = {}
    for item in header.split(","):
        name, _, value = item.strip().partition("=")
        if value.strip():
            parts.setdefault(name.strip(), []).append(value.strip())
    return parts


def check(
    secret: str | bytes,
    body: bytes,
    header: str | None,
    *,
    headers: Headers,
    also_cover: Iterable[str] = (),
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
    accept_v1: bool = False,
) -> str:
    """The scheme (``"v2"``, or ``"v1"`` with *accept_v1*) under which *header* signs *body*
    and *headers* within *tolerance* seconds of *now*; else raise ``SignatureError``.

    A header with a ``v2=`` digest is judged by it alone: a v1 digest next to it
    is never a fallback. Digests are compared in constant time.
    """
    parts, ts = _read(secret, header)
    if parts.get("v2"):
        scheme, given = "v2", parts["v2"]
        expected = _digest_v2(secret, ts, headers, body, also_cover)
    elif parts.get("v1"):
        if not accept_v1:
            raise SignatureError(
                "v1 signatures do not cover the envelope (message id, type, key, sequence, "
                "correlation id), so a captured request could be replayed under a new id; "
                "upgrade the sender to v2",
                "v1",
            )
        scheme, given = "v1", parts["v1"]
        expected = _digest_v1(secret, ts, body)
    else:
        raise SignatureError(f"malformed {SIGNATURE_HEADER} header: no v2= digest", "malformed")
    _compare(expected, given, ts, tolerance, now)
    return scheme


def _compare(expected: str, given: list[str], ts: int, tolerance: float, now: float | None) -> None:
    """Raise ``SignatureError`` unless one of *given* is *expected* and *ts* is within
    *tolerance* of *now*."""
    matched = False
    for digest in given:
        # Every candidate is compared, so the time taken says nothing about which.
        matched |= hmac.compare_digest(expected.encode(), digest.encode("utf-8", "replace"))
    if not matched:
        raise SignatureError("bad signature", "bad")
    current = time.time() if now is None else now
    if abs(current - ts) > tolerance:
        raise SignatureError(
            f"signature timestamp outside the {tolerance:g} s window (a replay or a clock)",
            "stale",
        )


def verify(
    secret: str | bytes,
    body: bytes,
    header: str | None,
    *,
    headers: Headers,
    also_cover: Iterable[str] = (),
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
    accept_v1: bool = False,
) -> bool:
    """Whether :func:`check` accepts *header* (``False`` instead of ``SignatureError``)."""
    try:
        check(
            secret,
            body,
            header,
            headers=headers,
            also_cover=also_cover,
            tolerance=tolerance,
            now=now,
            accept_v1=accept_v1,
        )
    except SignatureError:
        return False
    return True


def wire_headers(headers: Mapping[str, str]) -> dict[str, bytes]:
    """Headers as a WSGI or ASGI server hands them over (each byte one Latin-1 character,
    PEP 3333; Django's ``request.headers``) turned back into the bytes that were sent."""
    return {name: _wire(value) for name, value in headers.items()}


def _wire(value: str) -> bytes:
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:  # not from a server: text, sent as UTF-8
        return value.encode("utf-8")
