"""HMAC-SHA256 signatures for HTTP deliveries.

The header value is ``t=<unix seconds>,v1=<hex digest>`` where the digest is
HMAC-SHA256 of ``b"<t>." + body`` under the shared secret. Binding the
timestamp into the digest lets a receiver reject replays older than a
tolerance.
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "Outbox-Signature"
DEFAULT_TOLERANCE_SECONDS = 300


def _digest(secret: str | bytes, timestamp: int, body: bytes) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def sign(secret: str | bytes, body: bytes, timestamp: int | None = None) -> str:
    """The ``Outbox-Signature`` header value for *body* at *timestamp* (now)."""
    if not secret:
        raise ValueError("a signing secret is required")
    ts = int(time.time()) if timestamp is None else int(timestamp)
    return f"t={ts},v1={_digest(secret, ts, body)}"


def verify(
    secret: str | bytes,
    body: bytes,
    header: str | None,
    *,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> bool:
    """Whether *header* is a valid signature of *body* no older than *tolerance* seconds."""
    if not header or not secret:
        return False
    parts: dict[str, list[str]] = {}
    for item in header.split(","):
        name, sep, value = item.strip().partition("=")
        if sep:
            parts.setdefault(name, []).append(value)
    try:
        ts = int(parts["t"][0])
    except (KeyError, ValueError):
        return False
    current = time.time() if now is None else now
    if abs(current - ts) > tolerance:
        return False
    expected = _digest(secret, ts, body)
    return any(hmac.compare_digest(expected, given) for given in parts.get("v1", []))
