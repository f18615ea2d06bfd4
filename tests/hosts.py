"""Hosts on one machine: each a network namespace joined to this one by a veth pair.

A process started in a host reaches PostgreSQL, MariaDB, Redis, RabbitMQ (and any
port of this machine's loopback the caller names) at the host's gateway address,
through a forwarder on this side of the veth. ``cut()`` takes the link down: the
host's packets vanish (no reset, no refusal: its connections hang as they would
behind a dead switch) until ``reconnect()``.

The forwarder stands in for the servers' own TCP stacks, so it behaves as a server
configured the way ``docs/operations.md`` recommends: keepalive probes after 5 s
idle, every 2 s, 3 unanswered ones close the connection (PostgreSQL's
``tcp_keepalives_*``; RabbitMQ's heartbeats do the same). A host cut off for longer
than about 11 s loses its connections, and the servers roll back what it had open;
a shorter cut leaves them open, and the host's writes arrive late.

Needs root (CAP_NET_ADMIN) and iproute2. ``available()`` says why not, and the
tests skip with that reason, except under ``CI``, where they fail.

Run as ``python -m tests.hosts forward LISTEN=TARGET ...`` it is the forwarder.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent

#: The services of ``tests.services`` a host reaches, by port on 127.0.0.1.
SERVICE_PORTS = (5432, 3306, 6379, 5672)

#: Keepalive of the forwarder's host-facing sockets: idle seconds, interval, probes.
KEEPALIVE = (5, 2, 3)
#: Seconds after which the servers drop the connections of a host that went silent.
DEAD_AFTER = KEEPALIVE[0] + KEEPALIVE[1] * KEEPALIVE[2]

_numbers = itertools.count(1)


def available() -> str | None:
    """None when this process can make network namespaces, else why not."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    name = f"doxprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")


class Host:
    """One network namespace with a veth pair; its processes see the services at
    ``gateway``."""

    def __init__(self, name: str, ports: Sequence[int] = SERVICE_PORTS) -> None:
        number = next(_numbers)
        tag = f"{os.getpid() % 10000}x{number}"
        self.name = name
        self.netns = f"dox-{name}-{tag}"
        self.outer = f"dxh{tag}"  # this side of the veth (15 characters at most)
        inner = f"dxn{tag}"
        # A /30 this process owns: 10.<200 + 25 x its pytest-xdist worker number + pid
        # mod 25>.<host number>.0 (two workers never share a subnet).
        worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
        base = f"10.{200 + (25 * worker + os.getpid() % 25) % 56}.{number % 256}"
        self.gateway = f"{base}.1"
        self.address = f"{base}.2"
        self.ports = tuple(ports)
        self._forwarder: subprocess.Popen[bytes] | None = None
        self._processes: list[subprocess.Popen[str]] = []
        self.cut_off = False
        _run("ip", "netns", "add", self.netns)
        try:
            _run("ip", "link", "add", self.outer, "type", "veth", "peer", "name", inner)
            _run("ip", "link", "set", inner, "netns", self.netns)
            _run("ip", "addr", "add", f"{self.gateway}/30", "dev", self.outer)
            _run("ip", "link", "set", self.outer, "up")
            inside = ("ip", "netns", "exec", self.netns)
            _run(*inside, "ip", "addr", "add", f"{self.address}/30", "dev", inner)
            _run(*inside, "ip", "link", "set", inner, "up")
            _run(*inside, "ip", "link", "set", "lo", "up")
            self._start_forwarder()
        except BaseException:
            self.close()
            raise

    def _start_forwarder(self) -> None:
        pairs = [f"{self.gateway}:{port}=127.0.0.1:{port}" for port in self.ports]
        self._forwarder = subprocess.Popen(
            [sys.executable, "-m", "tests.hosts", "forward", *pairs], cwd=ROOT
        )
        deadline = time.monotonic() + 10
        for port in self.ports:
            while True:
                try:
                    socket.create_connection((self.gateway, port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or self._forwarder.poll() is not None:
                        raise RuntimeError(
                            f"the forwarder of host {self.name} did not listen on "
                            f"{self.gateway}:{port}"
                        ) from None
                    time.sleep(0.05)

    def url(self, url: str) -> str:
        """*url* (a service on 127.0.0.1) as a process in this host reaches it."""
        parts = urlsplit(url)
        if parts.hostname not in ("127.0.0.1", "localhost"):
            return url
        netloc = parts.netloc.replace(parts.hostname, self.gateway, 1)
        return urlunsplit(parts._replace(netloc=netloc))

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """*env* with every service URL in it (JSON settings included) moved to this
        host's gateway."""
        moved = {}
        for key, value in env.items():
            for local in ("://127.0.0.1:", "://localhost:", "@127.0.0.1:", "@localhost:"):
                value = value.replace(local, local.replace(local.strip(":/@"), self.gateway))
            moved[key] = value
        return moved

    def spawn(self, argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[str]:
        """Start *argv* inside this host (``ip netns exec`` execs it: same pid)."""
        process = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, *argv],
            cwd=ROOT,
            env=self.env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._processes.append(process)
        return process

    def cut(self) -> None:
        """Take the link down: packets both ways vanish, nobody is told."""
        _run("ip", "link", "set", self.outer, "down")
        self.cut_off = True

    def reconnect(self) -> None:
        _run("ip", "link", "set", self.outer, "up")
        self.cut_off = False

    @contextlib.contextmanager
    def cut_for(self) -> Iterator[None]:
        self.cut()
        try:
            yield
        finally:
            self.reconnect()

    def close(self) -> None:
        """Kill what runs inside, the forwarder, and the namespace (and so the veth)."""
        for process in self._processes:
            if process.poll() is None:
                process.kill()
            with contextlib.suppress(Exception):
                process.communicate(timeout=10)
        if self._forwarder is not None and self._forwarder.poll() is None:
            self._forwarder.kill()
            self._forwarder.wait(timeout=10)
        subprocess.run(["ip", "link", "del", self.outer], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)


# The forwarder -------------------------------------------------------------------


def _keepalive(sock: socket.socket) -> None:
    idle, interval, count = KEEPALIVE
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
    # Unacknowledged data gives up as soon as idle probes would have.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEAD_AFTER * 1000)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


async def _forward(listen: tuple[str, int], target: tuple[str, int]) -> asyncio.Server:
    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            _keepalive(sock)
        try:
            server_reader, server_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await asyncio.gather(_pipe(reader, server_writer), _pipe(server_reader, writer))

    return await asyncio.start_server(accepted, *listen, reuse_address=True)


async def _serve(pairs: Sequence[str]) -> None:
    servers = []
    for pair in pairs:
        listen, target = pair.split("=")
        host, port = listen.rsplit(":", 1)
        to_host, to_port = target.rsplit(":", 1)
        servers.append(await _forward((host, int(port)), (to_host, int(to_port))))
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    # A connection reset or cancelled while the host is cut off or torn down is the
    # point of the exercise, not an error worth a traceback.
    loop.set_exception_handler(lambda loop, context: None)
    loop.add_signal_handler(signal.SIGTERM, stopped.set)
    await stopped.wait()
    for server in servers:
        server.close()


if __name__ == "__main__":
    if sys.argv[1:2] != ["forward"]:
        sys.exit("usage: python -m tests.hosts forward LISTEN_HOST:PORT=TARGET_HOST:PORT ...")
    asyncio.run(_serve(sys.argv[2:]))
