"""On-commit triggers: one dispatch per transaction, carrying all its message ids.

With ``DISPATCH_IN_BACKGROUND`` (the default) the commit only hands the ids to
a per-process daemon thread, which publishes the Celery trigger: the caller
never waits on the broker, and triggers of transactions that commit while one
is being published are merged into the next. If the process dies before the
thread publishes, the rows are committed all the same and the recovery sweep
delivers them.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from django.db import connections, transaction

from django_outbox.conf import get_settings

logger = logging.getLogger("django_outbox.dispatch")

_ATTRIBUTE = "_django_outbox_trigger"
#: Most ids one Celery trigger carries; a larger merge is split.
MAX_IDS_PER_TRIGGER = 5000


class Trigger:
    """Collects the ids sent in one transaction and dispatches them once after commit.

    ``send()`` registers the same trigger with ``on_commit`` for every message,
    so the trigger survives the rollback of a savepoint that registered it
    first; it runs once, on the first call. Ids of rows rolled back with a
    savepoint are harmless: the relay finds nothing to claim for them.
    """

    __slots__ = ("fired", "ids", "using")

    def __init__(self, using: str) -> None:
        self.using = using
        self.ids: list[int] = []
        self.fired = False

    def __call__(self) -> None:
        if self.fired:
            return
        self.fired = True
        dispatch(self.using, self.ids)


def schedule(using: str, pk: int) -> None:
    """Arrange for message *pk* to be dispatched when the current transaction commits."""
    connection = connections[using]
    if not connection.in_atomic_block:
        dispatch(using, [pk])
        return
    trigger: Trigger | None = getattr(connection, _ATTRIBUTE, None)
    if trigger is None or trigger.fired:
        trigger = Trigger(using)
        setattr(connection, _ATTRIBUTE, trigger)
    trigger.ids.append(pk)
    transaction.on_commit(trigger, using=using)


def dispatch(using: str, ids: Sequence[int]) -> None:
    """Wake a relay for *ids* as ``DISPATCH`` says; never raises (the sweep is the backstop)."""
    config = get_settings()
    if config.dispatch == "celery" and config.dispatch_in_background:
        _background.submit(using, ids)
    else:
        dispatch_now(using, ids)


def dispatch_now(using: str, ids: Sequence[int]) -> None:
    """Publish the trigger for *ids* in this thread."""
    config = get_settings()
    mode = config.dispatch
    try:
        if mode == "celery":
            from django_outbox.tasks import deliver_messages

            options: dict[str, Any] = (
                {"queue": config.deliver_task_queue} if config.deliver_task_queue else {}
            )
            for start in range(0, len(ids), MAX_IDS_PER_TRIGGER):
                chunk = list(ids[start : start + MAX_IDS_PER_TRIGGER])
                deliver_messages.apply_async(
                    args=(chunk,), kwargs={"using": using}, retry=False, **options
                )
        elif mode == "notify":
            connection = connections[using]
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_notify(%s, '')", [config.notify_channel])
    except Exception:
        # The rows are committed; the recovery sweep will deliver them.
        logger.exception(
            "could not dispatch %d outbox message(s) (%s); the sweep will deliver them",
            len(ids),
            mode,
        )


class BackgroundDispatcher:
    """A daemon thread that publishes triggers handed over by committing threads."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget all state (a forked child starts here)."""
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: defaultdict[str, list[int]] = defaultdict(list)
        self._busy = False
        self._thread: threading.Thread | None = None
        self._pid = 0

    def submit(self, using: str, ids: Sequence[int]) -> None:
        """Queue *ids* for the next trigger (returns at once)."""
        with self._lock:
            if self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
                # First use, or a forked child: the parent's thread is not ours.
                self._pending = defaultdict(list)
                self._busy = False
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._run, name="django-outbox-dispatch", daemon=True
                )
                self._thread.start()
            self._pending[using].extend(ids)
            self._wake.notify()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued trigger is published; return False on timeout."""
        with self._lock:
            return self._wake.wait_for(lambda: not self._pending and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                self._wake.wait_for(lambda: bool(self._pending))
                batch, self._pending = self._pending, defaultdict(list)
                self._busy = True
            try:
                for using, ids in batch.items():
                    dispatch_now(using, ids)
                # A quiet process publishes each trigger at once; a busy one
                # publishes at most one per window, carrying every id that
                # committed meanwhile: under load triggers stop costing the
                # committing threads (and the workers) anything per message.
                time.sleep(get_settings().dispatch_coalesce_seconds)
            finally:
                with self._lock:
                    self._busy = False
                    self._wake.notify_all()


_background = BackgroundDispatcher()
# A child forked while the parent held the lock would deadlock on it, and the
# parent's thread does not exist in the child: start the child afresh.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_background.reset)


def flush(timeout: float = 5.0) -> bool:
    """Publish queued background triggers now (tests, shutdown); False on timeout."""
    return _background.flush(timeout)


atexit.register(flush, 2.0)
