"""The harness's processes and the supervisor that restarts every one that dies.

Each process writes its output to a log file of the run (a pipe nobody reads would
stall it). A process of a host is started inside the host's network namespace
(``ip netns exec`` execs it: the pid is the process's own, so SIGKILL reaches it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests import hosts

ROOT = hosts.ROOT


@dataclass
class Process:
    """One supervised process: what it runs, where, and what became of it."""

    name: str
    kind: str
    argv: Sequence[str]
    env: Mapping[str, str]
    log: Path
    host: hosts.Host | None = None
    #: A one-shot process (a producer) is restarted only when it did not finish.
    once: bool = False
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0
    kills: int = 0
    #: Exit statuses of the runs that ended on their own (not by our SIGKILL/SIGTERM).
    exits: list[int] = field(default_factory=list)
    finished: bool = False
    #: When a one-shot process was seen to have finished (``time.time()``).
    finished_at: float | None = None
    _out: IO[bytes] | None = None

    def start(self) -> None:
        argv = list(self.argv)
        env = dict(self.env)
        if self.host is not None:
            argv = ["ip", "netns", "exec", self.host.netns, *argv]
            env = self.host.env(env)
        if self._out is None:
            self._out = self.log.open("ab")
        self._out.write(f"--- start {self.starts + 1} at {time.time():.3f}\n".encode())
        self._out.flush()
        self.popen = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=self._out, stderr=subprocess.STDOUT
        )
        self.starts += 1

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> bool:
        """SIGKILL it if it runs; True if it did."""
        if not self.alive:
            return False
        assert self.popen is not None
        self.kills += 1
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait()
        return True

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM, then SIGKILL after *timeout* seconds."""
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        if self._out is not None:
            self._out.close()
            self._out = None


class Supervisor:
    """Restarts every process that died (after *pause* seconds), as systemd would."""

    def __init__(self, processes: Sequence[Process], pause: float = 0.5) -> None:
        self.processes = list(processes)
        self.pause = pause
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)

    def start(self) -> None:
        for process in self.processes:
            process.start()
        self._thread.start()

    def kill(self, process: Process) -> bool:
        """SIGKILL *process* (the supervisor restarts it); True if it was running."""
        with self._lock:
            return process.kill()

    def _watch(self) -> None:
        while not self._stopping.wait(0.1):
            for process in self.processes:
                with self._lock:
                    if process.finished or process.popen is None:
                        continue
                    status = process.popen.poll()
                    if status is None:
                        continue
                    if status != -signal.SIGKILL:
                        process.exits.append(status)
                    if process.once and status == 0:
                        process.finished = True
                        process.finished_at = time.time()
                        continue
                    time.sleep(self.pause)
                    if not self._stopping.is_set():
                        process.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)
        with self._lock:
            for process in self.processes:
                if process.popen is not None and process.popen.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(process.popen.pid, signal.SIGTERM)
            for process in self.processes:
                process.stop()
