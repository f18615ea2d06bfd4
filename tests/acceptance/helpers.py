"""Helpers for tests that run real relay and Celery worker processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from django_outbox.outbox.models import OutboxMessage
from tests.conftest import ROOT, subprocess_env


def wait_for(
    condition: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.1
) -> Any:
    """Poll *condition* until it returns something truthy or *timeout* seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def stop(process: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout: float = 20) -> str:
    """Signal *process*, wait for it, and return its output."""
    if process.poll() is None:
        os.kill(process.pid, sig)
    output, _ = process.communicate(timeout=timeout)
    return output


def read_as_it_comes(process: subprocess.Popen[str]) -> subprocess.Popen[str]:
    """Read *process*'s output on a thread as it comes (a full pipe would stall it);
    ``finish(process)`` stops it and returns what it printed."""
    lines: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    process.lines = lines  # type: ignore[attr-defined]
    process.reader = reader  # type: ignore[attr-defined]
    return process


def start_command(*args: str, **env: str) -> subprocess.Popen[str]:
    """``manage.py *args`` in a child process sharing this test's database and
    settings (plus *env*), its output read as it comes."""
    from tests.conftest import spawn_manage

    return read_as_it_comes(spawn_manage(*args, env=subprocess_env(**env)))


def wait_for_workers(count: int) -> None:
    """Until *count* worker processes have written their heartbeat row."""
    from django_outbox.engine.models import Worker

    wait_for(lambda: Worker.objects.count() >= count, timeout=60, what=f"{count} worker(s)")


def finish(process: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout: float = 20) -> str:
    """Signal a process started with ``read_as_it_comes``, wait, return its output."""
    if process.poll() is None:
        os.kill(process.pid, sig)
    process.wait(timeout=timeout)
    process.reader.join(timeout=timeout)  # type: ignore[attr-defined]
    return "".join(process.lines)  # type: ignore[attr-defined]


def describe_outputs(names: list[str], outputs: list[str], lines: int = 40) -> str:
    """The last *lines* lines each process printed, under its name: for a test's
    failure message when processes stalled."""
    parts = []
    for name, output in zip(names, outputs, strict=True):
        tail = output.splitlines()[-lines:]
        parts.append(f"--- {name}, its last {len(tail)} lines:\n" + "\n".join(tail))
    return "\n".join(parts)


def kombu_ids_in_redis(url: str, queue: str) -> list[str]:
    """Message ids of the kombu messages waiting in a Redis list, oldest first."""
    client = redis.Redis.from_url(url)
    raw = client.lrange(queue, 0, -1)
    client.close()
    return [json.loads(item)["properties"]["message_id"] for item in reversed(raw)]


def state_counts() -> dict[str, int]:
    counts: dict[str, int] = {}
    for state in OutboxMessage.objects.values_list("state", flat=True):
        counts[state] = counts.get(state, 0) + 1
    return counts


class CeleryWorker:
    """A Celery prefork worker (*concurrency* child processes, one by default) of the
    test project on *queue*, its output read as it comes."""

    def __init__(self, queue: str, concurrency: int = 1, **env: str) -> None:
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "testproject", "worker"),
                *("--pool=prefork", "--concurrency", str(concurrency), "-Q", queue, "-l", "INFO"),
                *("--without-heartbeat", "--without-gossip", "--without-mingle"),
            ],
            cwd=ROOT,
            env=subprocess_env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self):
        return "\n".join(self.lines)

    def said(self, text):
        return any(text in line for line in self.lines)

    def children(self):
        """The pool's child processes (Linux: /proc/<pid>/task/<tid>/children)."""
        pids = []
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            pids += [int(pid) for pid in (task / "children").read_text().split()]
        return pids

    def stop(self):
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.reader.join(timeout=10)
