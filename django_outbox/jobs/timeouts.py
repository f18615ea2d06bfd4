"""Per-task time limits: ``@task(timeout=30)``.

A job that runs longer than its timeout has ``JobTimeout`` raised inside it
(a ``TimeoutError``, so it is retried like any other error unless the task
says otherwise). The alarm is ``SIGALRM``, which only the main thread of a
process receives: the limit holds in ``jobs_worker`` and in Celery's prefork
and solo pools. Where jobs run in other threads (Celery's threads pool) it
cannot be enforced; a warning says so once, and the job runs unlimited.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger("django_outbox.jobs")

_warned = False


class JobTimeout(TimeoutError):
    """A job ran longer than its task's ``timeout``."""


@contextmanager
def time_limit(seconds: float | None, what: str) -> Iterator[None]:
    """Raise ``JobTimeout`` in the block if it runs longer than *seconds* (``None``: no
    limit)."""
    global _warned
    if not seconds:
        yield
        return
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "setitimer"
    ):
        if not _warned:
            _warned = True
            logger.warning(
                "%s has a timeout, but jobs here run outside the main thread, where no "
                "alarm can interrupt them: timeouts are not enforced in this process",
                what,
            )
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise JobTimeout(f"{what} ran longer than its timeout of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


__all__ = ["JobTimeout", "time_limit"]
