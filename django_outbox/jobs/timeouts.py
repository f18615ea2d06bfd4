"""Per-task time limits: ``@task(timeout=30)``.

A job that runs longer than its timeout has ``JobTimeout`` raised inside it
(a ``TimeoutError``, so it is retried like any other error unless the task
says otherwise).

- A sync task is interrupted by an alarm, ``SIGALRM``, which only the main
  thread of a process receives: the limit holds in ``jobs_worker`` and in
  Celery's prefork and solo pools. Where jobs run in other threads (Celery's
  threads pool) it cannot be enforced; a warning says so once, and the job
  runs unlimited.
- An async task is limited inside its event loop (``asyncio.timeout``): it
  is cancelled where it awaits, and none of its code runs after the timeout,
  in any thread. An alarm would only interrupt the thread waiting for the
  loop (``async_to_sync`` runs it in another), and the coroutine would go on.
  The price: a coroutine that blocks its loop without awaiting (``time.sleep``
  in an ``async def``) is stopped only at its next ``await``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from inspect import iscoroutinefunction
from typing import Any

from asgiref.sync import async_to_sync

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
        raise JobTimeout(_overran(what, seconds))

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def call_limited(
    task: Any, args: Sequence[Any], kwargs: Mapping[str, Any], seconds: float | None, what: str
) -> Any:
    """Call *task* (Django's ``Task``, as ``Task.call`` does) with ``JobTimeout`` raised
    in it after *seconds* (``None``: no limit): in its event loop if it is async, by
    ``time_limit`` otherwise."""
    if seconds and iscoroutinefunction(task.func):
        return async_to_sync(_within)(task.func, args, kwargs, seconds, what)
    with time_limit(seconds, what):
        return task.call(*args, **kwargs)


async def _within(
    func: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    seconds: float,
    what: str,
) -> Any:
    """Await ``func(*args, **kwargs)``, cancelled after *seconds* (``JobTimeout``)."""
    deadline = asyncio.timeout(seconds)
    try:
        async with deadline:
            return await func(*args, **kwargs)
    except TimeoutError as exc:
        if not deadline.expired():
            raise  # the task's own TimeoutError
        # Chained: the traceback shows the await the job was cancelled at.
        raise JobTimeout(_overran(what, seconds)) from exc


def _overran(what: str, seconds: float) -> str:
    return f"{what} ran longer than its timeout of {seconds:g} s"


__all__ = ["JobTimeout", "call_limited", "time_limit"]
