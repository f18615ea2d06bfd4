"""Retrying statements the database aborted to break a deadlock."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import OperationalError

T = TypeVar("T")

logger = logging.getLogger("django_outbox.engine")

#: SQLSTATEs of PostgreSQL's deadlock and serialization failures.
_RETRY_SQLSTATES = frozenset({"40P01", "40001"})
#: MySQL/MariaDB: deadlock found, lock wait timeout.
_RETRY_MYSQL_CODES = frozenset({1213, 1205})


def is_transient(exc: BaseException) -> bool:
    """Whether *exc* is a deadlock or serialization failure worth one more try."""
    cause = exc.__cause__ or exc
    if getattr(cause, "sqlstate", None) in _RETRY_SQLSTATES:
        return True
    args: tuple[Any, ...] = getattr(cause, "args", ())
    return bool(args) and args[0] in _RETRY_MYSQL_CODES


def retry_transient(operation: Callable[[], T], *, attempts: int = 3, what: str = "") -> T:
    """Run *operation*, again after a short pause if the database aborted it as a
    deadlock victim. *operation* must be safe to repeat (fenced, or a whole
    transaction that was rolled back)."""
    for attempt in range(1, attempts + 1):
        try:
            return operation()
        except OperationalError as exc:
            if attempt == attempts or not is_transient(exc):
                raise
            logger.info("%s: %s; retrying (%d/%d)", what or "statement", exc, attempt, attempts)
            time.sleep(0.01 * attempt)
    raise AssertionError("unreachable")
