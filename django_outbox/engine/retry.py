"""Retrying statements the database aborted (deadlock victims) or lost (dropped connections).

Every statement the engine retries is safe to repeat: a claim is one
statement or one transaction, rolled back whole when it fails, and every
recording is fenced by the lease token. Recording again on a new connection
is what keeps a batch that was published from waiting out its lease (and
being published again) when the connection dies between publish and record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import InterfaceError, OperationalError, connections

T = TypeVar("T")

logger = logging.getLogger("django_outbox.engine")

#: SQLSTATEs of PostgreSQL's deadlock and serialization failures.
_RETRY_SQLSTATES = frozenset({"40P01", "40001"})
#: MySQL/MariaDB: deadlock found, lock wait timeout.
_RETRY_MYSQL_CODES = frozenset({1213, 1205})
#: Pauses before each new try on a fresh connection (seconds).
RECONNECT_PAUSES = (0.0, 0.05, 0.2, 0.5, 1.0)


def is_transient(exc: BaseException) -> bool:
    """Whether *exc* is a deadlock or serialization failure worth one more try."""
    cause = exc.__cause__ or exc
    if getattr(cause, "sqlstate", None) in _RETRY_SQLSTATES:
        return True
    args: tuple[Any, ...] = getattr(cause, "args", ())
    return bool(args) and args[0] in _RETRY_MYSQL_CODES


#: MySQL/MariaDB client errors of a dropped connection: gone away, lost during a
#: query, lost (the server's side), the server closed it for inactivity.
_LOST_MYSQL_CODES = frozenset({2006, 2013, 2055, 4031})


def connection_broken(using: str) -> bool:
    """Whether the connection *using* is closed or broken (a query on it cannot succeed,
    whatever the transaction): the work must go again on a new connection."""
    raw = connections[using].connection
    if raw is None:
        return False  # never opened, or closed on purpose: nothing in flight
    return bool(getattr(raw, "closed", False) or getattr(raw, "broken", False))


def connection_lost(using: str, exc: BaseException) -> bool:
    """Whether *exc* means the connection *using* is gone, and it may be replaced (no
    transaction of the caller's is open on it)."""
    connection = connections[using]
    if connection.in_atomic_block:
        return False  # the caller's transaction is lost with it: theirs to handle
    cause = exc.__cause__ or exc
    sqlstate = str(getattr(cause, "sqlstate", "") or "")
    # PostgreSQL: connection exceptions (08…) and administrator or crash shutdowns (57P…).
    if sqlstate.startswith(("08", "57P")) or isinstance(exc, InterfaceError):
        return True
    args: tuple[Any, ...] = getattr(cause, "args", ())
    if args and args[0] in _LOST_MYSQL_CODES:
        return True
    raw = connection.connection
    return raw is None or bool(getattr(raw, "closed", False))


def retry_transient(
    operation: Callable[[], T],
    *,
    attempts: int = 3,
    what: str = "",
    reconnect: str | None = None,
) -> T:
    """Run *operation*; again after a short pause if the database aborted it as a
    deadlock victim, and, with *reconnect* (a database alias), on a new connection
    if the connection was lost. *operation* must be safe to repeat."""
    deadlocks = 0
    reconnects = 0
    while True:
        try:
            return operation()
        except (OperationalError, InterfaceError) as exc:
            if is_transient(exc) and deadlocks + 1 < attempts:
                deadlocks += 1
                logger.info(
                    "%s: %s; retrying (%d/%d)", what or "statement", exc, deadlocks, attempts
                )
                time.sleep(0.01 * deadlocks)
                continue
            if reconnect is None or reconnects >= len(RECONNECT_PAUSES):
                raise
            if not connection_lost(reconnect, exc):
                raise
            # Quiet: a blip recovered here is nobody's concern, and an outage that outlasts
            # the retries reaches the caller, which says so once per episode.
            logger.debug(
                "%s: database connection lost (%s); retrying on a new connection",
                what or "statement",
                exc,
            )
            connections[reconnect].close()
            time.sleep(RECONNECT_PAUSES[reconnects])
            reconnects += 1
