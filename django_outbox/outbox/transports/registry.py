"""One transport instance per destination per thread, built lazily, closed with its thread.

Transports hold connections and per-batch state, so threads never share one
(Celery's thread pools; gevent and eventlet pools, where every task runs in a
greenlet with its own ``threading.local``). The transports of a thread live
in that thread's local storage: when the thread or greenlet ends, the storage
is dropped and a finalizer closes them, so short-lived greenlets leave no
connection open behind them.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref

from django.utils.module_loading import import_string

from django_outbox import conf
from django_outbox.conf import TRANSPORT_ALIASES, Destination, suggest
from django_outbox.exceptions import ConfigurationError
from django_outbox.outbox.transports.base import Transport


class _Holder:
    """A thread's transports by destination name; when the thread's local storage
    drops it, a finalizer closes them (it holds the dict, not the holder)."""

    __slots__ = ("__weakref__", "finalizer", "transports")

    def __init__(self) -> None:
        self.transports: dict[str, Transport] = {}
        self.finalizer = weakref.finalize(self, _close_each, self.transports)


_local = threading.local()
_lock = threading.Lock()
#: Every live thread's holder in this process, for ``close_all``.
_everyone: weakref.WeakSet[_Holder] = weakref.WeakSet()
_pid = os.getpid()


def transport_class(destination: Destination) -> type[Transport]:
    """Import the class configured for *destination*; raise ``ConfigurationError``."""
    path = destination.transport_path
    if "." not in path:
        raise ConfigurationError(
            f"destination {destination.name!r}: unknown transport {path!r}"
            f"{suggest(path, TRANSPORT_ALIASES)}; use one of {', '.join(TRANSPORT_ALIASES)} "
            "or the dotted path of a Transport class"
        )
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise ConfigurationError(
            f"destination {destination.name!r}: cannot import transport {path!r} ({exc}); "
            "is the matching extra installed (django-outbox-inbox[redis], [http], [postgres])?"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Transport)):
        raise ConfigurationError(f"destination {destination.name!r}: {path!r} is not a Transport")
    return cls


def _mine() -> dict[str, Transport]:
    global _pid
    if _pid != os.getpid():
        # A forked child: the parent's sockets are not ours to use, nor to close
        # (a close frame on a shared AMQP socket would end the parent's
        # connection). Forget them without closing.
        with _lock:
            _pid = os.getpid()
            for inherited in list(_everyone):
                inherited.finalizer.detach()
            _everyone.clear()
        _local.__dict__.clear()
    holder: _Holder | None = getattr(_local, "holder", None)
    if holder is None:
        holder = _local.holder = _Holder()
        with _lock:
            _everyone.add(holder)
    return holder.transports


def _close_each(transports: dict[str, Transport]) -> None:
    for transport in list(transports.values()):
        with contextlib.suppress(Exception):  # closing is best effort
            transport.close()
    transports.clear()


def get_transport(destination: Destination) -> Transport:
    """This thread's transport for *destination* (rebuilt after fork or a settings change)."""
    transports = _mine()
    transport = transports.get(destination.name)
    if transport is None or transport.destination != destination:
        if transport is not None:
            with contextlib.suppress(Exception):
                transport.close()
        transport = transport_class(destination)(destination)
        transports[destination.name] = transport
    return transport


def open_count() -> int:
    """Transports held by live threads of this process (for tests and diagnostics)."""
    with _lock:
        return sum(len(holder.transports) for holder in _everyone)


def close_all() -> None:
    """Close and forget every transport this process built."""
    with _lock:
        every = list(_everyone)
    for holder in every:
        _close_each(holder.transports)


conf.on_change(close_all)
