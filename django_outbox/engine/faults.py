"""Kill points: a process SIGKILLs itself at one named step, for the crash tests only.

Each step where a process can die (before a publish, between a handler's commit and
the broker's ack, inside a batch's finisher, …) is marked in the engine with
``faults.point(name)``. The crash tests start a real process with
``DJANGO_OUTBOX_KILL_AT=name`` (or ``name@N``: the N-th time this process reaches
that point; default the first) and it dies there by ``SIGKILL``, exactly as the OOM
killer or a node drain would kill it: no ``finally``, no cleanup, no flush. If
``DJANGO_OUTBOX_KILL_MARKER`` names a file, the process writes ``name@N pid`` to it
first, so the test knows the point was reached.

Unarmed (the variable was not set when this module was imported: production), a
point is one function call comparing a module global with ``None``; points are
reached once per group, batch, sweep or job, never per row of a batch. An unknown
name in the variable is an error at import (a typo would otherwise arm nothing and
the test would wait in vain), and the system check ``django_outbox.W022`` warns
loudly whenever a process is armed. Names are the closed set :data:`POINTS`; see
docs/reliability.md ("Kill points") for where each is and what must follow.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

#: The environment variable that arms one kill point: ``name`` or ``name@N``.
ENVIRONMENT = "DJANGO_OUTBOX_KILL_AT"
#: The environment variable naming a file written just before the kill.
MARKER_ENVIRONMENT = "DJANGO_OUTBOX_KILL_MARKER"

#: Every kill point, ``<part>.<step>``. The runner's points are named after the part
#: that runs (``<part>.before_record``), so only the parts listed here have them armed.
POINTS: tuple[str, ...] = (
    # outbox relay: a chunk's attempt is declared, nothing of it published yet
    "outbox.before_publish",
    # engine runner: a group's step is done (published, jobs ran), its outcomes unwritten
    "outbox.before_record",
    "jobs.before_record",
    # engine runner: a group's outcomes are written, the batch's next group not started
    "outbox.after_record",
    # lock mode: the handlers ran and the outcomes are written, the transaction is open
    "inbox.before_commit",
    # inbox_consume: the batch's transaction committed, nothing acknowledged to the broker
    "inbox.before_ack",
    # inbox_consume, Redis source: messages taken into the processing list, none stored
    "inbox.after_take",
    # jobs: a job's attempt is declared and its function is being called
    "jobs.in_job",
    # jobs: a batch's callback is enqueued and the batch marked finished, not committed
    "jobs.in_batch_finisher",
    # sweep: stuck jobs' rescue is written, its transaction not committed
    "jobs.in_rescue",
    # outbox_partition convert: step 1 done (indexes, the checked constraint), no swap
    "partitions.before_swap",
)


def _parse(value: str | None) -> tuple[str, int] | None:
    """``name`` or ``name@N`` as (name, N); ``None`` when unset or empty."""
    if not value:
        return None
    name, at, count = value.strip().partition("@")
    if name not in POINTS:
        raise ValueError(
            f"{ENVIRONMENT}={value!r}: unknown kill point {name!r}; the kill points are "
            + ", ".join(POINTS)
        )
    nth = 1
    if at:
        try:
            nth = int(count)
        except ValueError:
            nth = 0
        if nth < 1:
            raise ValueError(f"{ENVIRONMENT}={value!r}: N in name@N must be a whole number >= 1")
    return name, nth


#: The armed point and at which reach it kills (``None``: unarmed, the production case).
_armed: tuple[str, int] | None = _parse(os.environ.get(ENVIRONMENT))
_reached = 0
_lock = threading.Lock()


def armed() -> str | None:
    """The armed kill point as ``name@N``, or ``None`` (for the system check)."""
    return None if _armed is None else f"{_armed[0]}@{_armed[1]}"


def point(name: str) -> None:
    """Die by SIGKILL here if *name* is the armed kill point reached for the N-th time."""
    if _armed is None:
        return
    _reach(name)


def _reach(name: str) -> None:
    global _reached
    target, nth = _armed or ("", 0)
    if name != target:
        return
    with _lock:
        _reached += 1
        if _reached < nth:
            return
        marker = os.environ.get(MARKER_ENVIRONMENT)
        if marker:
            Path(marker).write_text(f"{name}@{_reached} {os.getpid()}\n")
        os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["ENVIRONMENT", "MARKER_ENVIRONMENT", "POINTS", "armed", "point"]
