"""The AMQP transport of ``inbox_consume``: py-amqp's, reading the socket in large pieces.

py-amqp reads a frame in three ``recv`` calls (its header, its payload, its end
byte), each asking the socket for exactly the bytes it needs: a message of three
frames costs nine system calls, the largest single cost of receiving it (issue 17
§4). This transport asks for up to :data:`READ_SIZE` bytes whenever what it holds
does not make up the bytes wanted, and serves the next frames from what came: under
load, one system call brings a few dozen messages. While the next frame is held whole,
the socket's timeout is not set for it and put back (py-amqp does both for every
frame, two more system calls): no read will wait.

What it holds and has not handed out stays readable as py-amqp's ``_read_buffer``:
when a read times out in the middle of a frame, py-amqp puts the frame's first
bytes back in front of it, and the next read starts again from them, as with the
plain transport. Data held here is read before the socket is waited on, so a
consumer that drains events (``inbox_consume``'s loop) never leaves a received
frame waiting; an event loop that polls the socket's file descriptor would (Celery's
hub), which is why only ``inbox_consume`` uses it.

Only plain TCP: a TLS connection (``amqps://``, ``ssl``) keeps py-amqp's own
transport, whose reads go through the TLS layer's buffer already.

It relies on methods of py-amqp's TCP transport that are not public (``_read``,
``_setup_transport``, and ``having_timeout``), checked against the version ``pyproject.toml``
pins by ``tests/integration/test_amqp_reads.py``.
"""

from __future__ import annotations

import contextlib
import errno
import struct
from collections.abc import Callable, Iterator
from typing import Any

import amqp
import amqp.transport
from kombu.transport import pyamqp

#: The most one ``recv`` asks for: a few dozen small messages. Each frame handed out
#: is a copy of its own bytes only (the rest stays where it is, read by position).
READ_SIZE = 16384

_RETRY_ERRNOS = (errno.EAGAIN, errno.EINTR)
#: A frame's payload size: after its type (one octet) and channel (two).
_SIZE = struct.Struct(">I")


class BufferedTCPTransport(amqp.transport.TCPTransport):
    """py-amqp's TCP transport whose ``_read`` receives up to ``READ_SIZE`` bytes at a
    time and hands out frames from them by position."""

    #: Set by py-amqp: the socket's ``recv``, and whether an interrupted first read of a
    #: frame is a timeout.
    _quick_recv: Callable[[int], bytes]
    raise_on_initial_eintr: bool

    def _setup_transport(self) -> None:
        super()._setup_transport()  # type: ignore[misc]
        self._held = b""
        self._at = 0

    @property
    def _read_buffer(self) -> bytes:
        """The bytes received and not yet handed out (py-amqp's name for them)."""
        return self._held[self._at :]

    @_read_buffer.setter
    def _read_buffer(self, unread: bytes) -> None:
        self._held = unread
        self._at = 0

    @contextlib.contextmanager
    def having_timeout(self, timeout: float | None) -> Iterator[Any]:
        """The socket with *timeout* for the next frame's reads; as it is when the next
        frame is held whole (no read will wait: two ``settimeout`` calls saved)."""
        if timeout is None or self._holds_a_frame():
            yield self.sock
            return
        with super().having_timeout(timeout) as sock:
            yield sock

    def _holds_a_frame(self) -> bool:
        """Whether the next frame, its end octet included, is held."""
        at, held = self._at, self._held
        if len(held) - at < 7:
            return False
        size: int = _SIZE.unpack_from(held, at + 3)[0]
        return len(held) - at >= size + 8

    def _read(self, n: int, initial: bool = False, _errnos: Any = _RETRY_ERRNOS) -> bytes:
        """The next *n* bytes: from what is held when it has them, else after receiving
        more (as much as the socket gives, up to ``READ_SIZE``)."""
        start = self._at
        end = start + n
        held = self._held
        if end <= len(held):
            self._at = end
            return held[start:end]
        unread = held[start:]
        try:
            while len(unread) < n:
                try:
                    received = self._quick_recv(max(READ_SIZE, n - len(unread)))
                except OSError as exc:
                    if exc.errno not in _errnos:
                        raise
                    if initial and self.raise_on_initial_eintr:
                        raise TimeoutError() from exc
                    continue
                if not received:
                    raise OSError("Server unexpectedly closed connection")
                unread += received
        except BaseException:
            # Nothing is lost: what came stays held for the next read.
            self._read_buffer = unread
            raise
        self._held = unread
        self._at = n
        return unread[:n]


class _Connection(pyamqp.Connection):
    def Transport(  # py-amqp's name
        self,
        host: str,
        connect_timeout: Any,
        ssl: Any = False,
        read_timeout: Any = None,
        write_timeout: Any = None,
        socket_settings: Any = None,
        **kwargs: Any,
    ) -> Any:
        options = {
            "connect_timeout": connect_timeout,
            "read_timeout": read_timeout,
            "write_timeout": write_timeout,
            "socket_settings": socket_settings,
            **kwargs,
        }
        if ssl:
            return super().Transport(host, ssl=ssl, **options)
        return BufferedTCPTransport(host, **options)


class Transport(pyamqp.Transport):
    """kombu's py-amqp transport over :class:`BufferedTCPTransport`."""

    Connection = _Connection


def buffered_transport(url: str) -> type[Transport] | None:
    """The transport class ``inbox_consume`` passes kombu for *url*: this module's for a
    plain ``amqp://`` or ``pyamqp://`` URL (every host of a failover URL), ``None``
    (kombu's choice) for anything else."""
    schemes = {part.strip().split("://", 1)[0].lower() for part in url.split(";") if part}
    if schemes and schemes <= {"amqp", "pyamqp"}:
        return Transport
    return None
