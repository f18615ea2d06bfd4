"""One transport instance per destination per process, built lazily."""

from __future__ import annotations

import contextlib
import os
import threading

from django.utils.module_loading import import_string

from django_outbox import conf
from django_outbox.conf import Destination
from django_outbox.exceptions import ConfigurationError
from django_outbox.outbox.transports.base import Transport

_lock = threading.Lock()
#: Keyed by (process, thread, destination): transports hold connections and
#: per-batch state, so threads (Celery's thread or gevent pools) never share one.
_transports: dict[tuple[int, int, str], Transport] = {}


def transport_class(destination: Destination) -> type[Transport]:
    """Import the class configured for *destination*; raise ``ConfigurationError``."""
    path = destination.transport_path
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


def get_transport(destination: Destination) -> Transport:
    """This thread's transport for *destination* (rebuilt after fork)."""
    slot = (os.getpid(), threading.get_ident(), destination.name)
    transport = _transports.get(slot)
    if transport is None or transport.destination != destination:
        with _lock:
            transport = _transports.get(slot)
            if transport is None or transport.destination != destination:
                if transport is not None:
                    transport.close()
                transport = transport_class(destination)(destination)
                _transports[slot] = transport
    return transport


def close_all() -> None:
    """Close and forget every transport this process built."""
    with _lock:
        pid = os.getpid()
        for (owner, _, _), transport in list(_transports.items()):
            if owner == pid:
                with contextlib.suppress(Exception):  # closing is best effort
                    transport.close()
        _transports.clear()


conf.on_change(close_all)
