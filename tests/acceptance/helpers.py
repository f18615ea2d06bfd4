"""Helpers for tests that run real relay and Celery worker processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from django_outbox.outbox.models import OutboxMessage


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


def finish(process: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout: float = 20) -> str:
    """Signal a process started with ``read_as_it_comes``, wait, return its output."""
    if process.poll() is None:
        os.kill(process.pid, sig)
    process.wait(timeout=timeout)
    process.reader.join(timeout=timeout)  # type: ignore[attr-defined]
    return "".join(process.lines)  # type: ignore[attr-defined]


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
