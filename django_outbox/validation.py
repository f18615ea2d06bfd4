"""Checks shared by what enters the outbox and the inbox: JSON payloads, names, headers.

Each raises an ``InvalidMessage`` (``PayloadError`` for payloads and
headers) saying which value is wrong and why; nothing is stored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from django_outbox.exceptions import InvalidMessage, PayloadError

#: Made once: ``json.dumps`` with these options makes an encoder on every call.
_ENCODER = DjangoJSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def encode_json(value: Any, *, what: str) -> tuple[str, int]:
    """The payload as JSON text and its size in UTF-8 bytes, or a ``PayloadError``
    saying why it cannot be stored."""
    if value is None:
        raise PayloadError(f"{what} is None; send a JSON object, list or value instead")
    try:
        text = _ENCODER.encode(value)
        encoded = text.encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError (lone surrogates) included
        raise PayloadError(f"{what} is not JSON-serializable: {exc}") from exc
    except RecursionError:
        raise PayloadError(f"{what} is nested too deeply to serialize") from None
    if _NUL_ESCAPE.search(text):
        raise PayloadError(
            f"{what} contains a NUL character (\\u0000), which PostgreSQL cannot store"
        )
    return text, len(encoded)


def check_text(name: str, value: Any, limit: int, *, required: bool = False) -> None:
    if value is None and not required:
        return
    if not isinstance(value, str) or not value:
        raise InvalidMessage(f"{name} must be a non-empty string, got {value!r}")
    if len(value) > limit:
        raise InvalidMessage(f"{name} is {len(value)} characters; the limit is {limit}")
    check_printable(name, value)


def check_printable(name: str, value: str) -> None:
    # These travel as message and HTTP headers: control characters (CR/LF
    # above all) would be refused there, or worse, split a header in two.
    if _CONTROL.search(value):
        raise InvalidMessage(f"{name} {value!r} contains control characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidMessage(f"{name} {value!r} is not valid UTF-8 text: {exc}") from exc


def escape_control(value: str) -> str:
    """*value* with control characters written as ``\\xNN`` and lone surrogates as
    ``\\udcNN``: printable text any database stores (for values kept for an operator
    to read, not to use)."""
    escaped = _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", value)
    return escaped.encode("utf-8", "backslashreplace").decode("utf-8")


def storable(value: str) -> str:
    """*value* with only what a database refuses escaped: NUL (PostgreSQL) and lone
    surrogates (not UTF-8); line breaks and tabs stay (error texts, bodies)."""
    return value.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def check_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise PayloadError(f"headers must be a mapping of strings, got {type(headers).__name__}")
    bad = [k for k, v in headers.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise PayloadError(f"header names and values must be strings; bad: {bad!r}")
    for name, value in headers.items():
        try:
            check_printable("header name", name)
            check_printable(f"header {name!r}", value)
        except InvalidMessage as exc:
            raise PayloadError(str(exc)) from exc
    return dict(headers)
