"""A TCP forwarder the tests can switch off to make a real broker unreachable, or
make lose a broker's answers on a live connection.

``mode``, switchable while connections are open:

- ``"forward"``: bytes pass both ways;
- ``"swallow_replies"``: requests reach the server, its answers are dropped
  (a publish arrives, its confirm or reply never comes back);
- ``"cut_after_request"``: the next request is forwarded, then the
  connection is closed (it dies after the write, before the answer).
"""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    """Forwards 127.0.0.1:<port> to *target*; ``down()`` refuses connections."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.mode = "forward"
        #: Connections accepted since the proxy was made.
        self.accepted = 0

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """Close the listener and every open connection: clients see resets and refusals."""
        listener, self._listener = self._listener, None
        if listener is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone
            # would leave the port accepting until that accept() returned.
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.update({client, upstream})
                self.accepted += 1
            for a, b, is_request in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pipe, args=(a, b, is_request), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, is_request: bool) -> None:
        try:
            while data := source.recv(65536):
                if is_request:
                    sink.sendall(data)
                    if self.mode == "cut_after_request":
                        return
                elif self.mode == "forward":
                    sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
