"""argparse ``type=`` validators shared by the outbox commands."""

from __future__ import annotations

import argparse
import uuid


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _whole_number(text, least=1)


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    return _whole_number(text, least=0)


def _whole_number(text: str, *, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """A number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value < 0 or value != value:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def port_number(text: str) -> int:
    """A TCP port, 1 to 65535."""
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port number (1-65535), got {value}")
    return value


def message_ref(text: str) -> int | uuid.UUID:
    """A row id (integer) or a message or result id (UUID)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a row id or a UUID, got {text!r}") from None
