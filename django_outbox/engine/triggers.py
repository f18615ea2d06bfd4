"""On-commit triggers: one dispatch per transaction and part, carrying all its row ids.

A part calls ``schedule(part, using, pk)`` for every row it inserts; after
the transaction commits, one trigger wakes the part's runners as
``DISPATCH`` says: ``celery`` sends the part's Celery task (through
Celery's router, so ``task_routes`` apply), ``notify`` runs ``pg_notify(channel, part)``
for the long-running workers, ``none`` leaves it to polling and the sweeps.

With ``DISPATCH_IN_BACKGROUND`` (the default) the commit only hands the ids to
a per-process daemon thread, which publishes the Celery trigger: the caller
never waits on the broker, and triggers of transactions that commit while one
is being published are merged into the next. If the process dies before the
thread publishes, the rows are committed all the same and a sweep runs them.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from django.db import connections, transaction
from django.utils.module_loading import import_string
from kombu.connection import ConnectionPool

from django_outbox.conf import get_settings

logger = logging.getLogger("django_outbox.dispatch")

#: Most ids one Celery trigger carries; a larger merge is split.
MAX_IDS_PER_TRIGGER = 5000

#: Dotted path of the Celery task that runs each part's batches, by part name.
TASKS: dict[str, str] = {}

#: Per part: given a trigger's sub-key (``"jobs:emails"`` → ``"emails"``), the extra
#: task kwargs and ``apply_async`` options of its trigger (a Celery queue, say).
Route = Callable[[str], tuple[dict[str, Any], dict[str, Any]]]
ROUTES: dict[str, Route] = {}


def register_task(part: str, task_path: str, route: Route | None = None) -> None:
    """Name the Celery task a trigger of *part* sends: ``task.apply_async(([ids],),
    {"using": alias})``; *task_path* is imported when the first trigger fires.

    A part whose rows go to different workers (jobs by queue) schedules them as
    ``"part:sub"``; *route* turns ``sub`` into extra kwargs and options.
    """
    TASKS[part] = task_path
    if route is not None:
        ROUTES[part] = route


class Trigger:
    """Collects the ids of one part inserted in one transaction; fires once after commit.

    The same trigger is registered with ``on_commit`` for every row, so it
    survives the rollback of a savepoint that registered it first; it runs
    once, on the first call. Ids of rows rolled back with a savepoint are
    harmless: the runner finds nothing to claim for them.
    """

    __slots__ = ("fired", "hooks", "ids", "part", "using")

    def __init__(self, part: str, using: str, hooks: list[Any]) -> None:
        self.part = part
        self.using = using
        self.ids: list[Any] = []
        self.fired = False
        #: The connection's list of on-commit hooks it was made for: Django replaces
        #: that list when the transaction commits or rolls back (or a savepoint does).
        self.hooks = hooks

    def __call__(self) -> None:
        if self.fired:
            return
        self.fired = True
        dispatch(self.part, self.using, self.ids)


def schedule(part: str, using: str, pk: Any) -> None:
    """Arrange for row *pk* of *part* to be triggered when the current transaction commits.
    With ``DISPATCH = "none"`` there is nothing to trigger: no on-commit callback."""
    if get_settings().dispatch == "none":
        return
    connection = connections[using]
    if not connection.in_atomic_block:
        dispatch(part, using, [pk])
        return
    attribute = f"_django_outbox_trigger_{part}"
    trigger: Trigger | None = getattr(connection, attribute, None)
    if trigger is None or trigger.fired or trigger.hooks is not connection.run_on_commit:
        # A trigger of its own for each transaction: one left by a transaction that
        # rolled back never fired, and must not carry its ids into this one.
        trigger = Trigger(part, using, connection.run_on_commit)
        setattr(connection, attribute, trigger)
    trigger.ids.append(pk)
    transaction.on_commit(trigger, using=using)


def dispatch(part: str, using: str, ids: Sequence[Any]) -> None:
    """Wake *part*'s runners for *ids* as ``DISPATCH`` says; never raises (sweeps are the
    backstop). Empty *ids* means "drain what is due" (after a rescue)."""
    config = get_settings()
    if config.dispatch == "celery" and config.dispatch_in_background:
        _background.submit(part, using, ids)
    else:
        dispatch_now(part, using, ids)


def dispatch_now(part: str, using: str, ids: Sequence[Any]) -> None:
    """Publish the trigger for *ids* in this thread."""
    config = get_settings()
    mode = config.dispatch
    try:
        if mode == "celery":
            _send_celery(part, using, ids)
        elif mode == "notify":
            connection = connections[using]
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT pg_notify(%s, %s)", [config.notify_channel, part.split(":")[0]]
                    )
    except Exception:
        # The rows are committed; a sweep will run them.
        logger.exception(
            "could not dispatch %d %s row(s) (%s); the sweep will run them", len(ids), part, mode
        )


_warned_default_app = False


def _send_celery(part: str, using: str, ids: Sequence[Any]) -> None:
    global _warned_default_app
    base, _, sub = part.partition(":")
    task = import_string(TASKS[base])
    extra, options = ROUTES[base](sub) if base in ROUTES else ({}, {})
    if not _warned_default_app and celery_app_missing(task.app):
        _warned_default_app = True
        logger.error(
            "DISPATCH is 'celery' but no Celery app is loaded in this process: triggers go to "
            "Celery's default app (amqp://localhost) and may never reach a worker. Import your "
            "Celery app in your project's __init__.py (see the quickstart), or set DISPATCH"
        )
    with _connections.connection(task.app) as connection:
        for start in range(0, max(len(ids), 1), MAX_IDS_PER_TRIGGER):
            chunk = list(ids[start : start + MAX_IDS_PER_TRIGGER])
            message = {"args": (chunk,), "kwargs": {"using": using, **extra}, **options}
            _publish(task, connection, part, message)


def _publish(task: Any, connection: Any, part: str, message: dict[str, Any]) -> None:
    """``task.apply_async(**message)`` on *connection*; once more, on a new connection,
    if the kept one had gone stale (the broker restarted, or dropped it while idle). A
    broker that is away refuses that connection at once."""
    for attempt in (1, 2):
        try:
            task.apply_async(retry=False, connection=connection, **message)
            return
        except Exception as exc:
            # A broken connection is not handed to the next trigger.
            connection.collect()
            if attempt == 2 or not _connection_lost(connection, exc):
                raise
            logger.warning(
                "the broker connection of %s triggers broke (%s: %s); sending again on a new one",
                part,
                type(exc).__name__,
                exc,
            )


def _connection_lost(connection: Any, exc: BaseException) -> bool:
    """Whether *exc* says the broker connection broke (not, say, a bad argument)."""
    lost = (OSError, *connection.recoverable_connection_errors)
    return isinstance(exc, lost) or isinstance(exc.__cause__, lost)


class _TriggerPool(ConnectionPool):
    # kombu closes a pool inherited by a child that billiard or multiprocessing forked;
    # for AMQP that shuts the socket the parent still uses. TriggerConnections forgets
    # the parent's pools in a child instead, and leaves their sockets alone.
    close_after_fork = False


class TriggerConnections:
    """Broker connections for Celery triggers, kept per Celery app and process: at most
    the app's ``broker_pool_limit`` of them (``None`` or 0 there turns keeping off).
    A trigger never waits for one: when all are in use (more threads publishing at
    once, a task run eagerly that triggers again), it gets a connection of its own,
    closed after it.

    They are the app's write connections (its ``broker_transport_options``
    apply) except that a refused or unreachable broker fails the trigger at
    once, where kombu would retry the connection for about 6 s: the rows are
    committed and a sweep runs them, so waiting helps nobody (and with
    ``DISPATCH_IN_BACKGROUND: False`` the committing request would wait).
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget all pools (a forked child must not share its parent's sockets)."""
        self._lock = threading.Lock()
        self._pools: dict[int, Any] = {}
        self._pid = os.getpid()

    def pool(self, app: Any) -> Any:
        key = id(app)
        with self._lock:
            if self._pid != os.getpid():
                # Forked without the interpreter's fork hooks (a server that forks
                # from C): the parent's connections are not this process's.
                self._pools, self._pid = {}, os.getpid()
            pool = self._pools.get(key)
            if pool is None:
                connection = app.connection_for_write(transport_options={"max_retries": 0})
                # kombu keeps connections only in a pool with a limit: without one each
                # trigger connected, declared its queue and closed again (2 ms of CPU
                # a trigger to Redis).
                pool = self._pools[key] = _TriggerPool(connection, limit=app.conf.broker_pool_limit)
            return pool

    @contextlib.contextmanager
    def connection(self, app: Any) -> Iterator[Any]:
        """A kept connection of *app*'s, or, if all are in use, one of this trigger's own."""
        pool = self.pool(app)
        try:
            kept = pool.acquire(block=False)
        except pool.LimitExceeded:
            with pool.connection.clone() as own:
                yield own
            return
        with kept:
            yield kept

    def close(self) -> None:
        with self._lock:
            pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.force_close_all()


_connections = TriggerConnections()


def celery_app_missing(app: Any) -> bool:
    """Whether *app* is the fallback Celery creates when no app was set up."""
    app = getattr(app, "_get_current_object", lambda: app)()
    # Celery builds it on demand as Celery("default", set_as_current=False).
    return getattr(app, "main", None) == "default" and not getattr(app, "set_as_current", True)


class BackgroundDispatcher:
    """A daemon thread that publishes triggers handed over by committing threads."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget all state (a forked child starts here)."""
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: defaultdict[tuple[str, str], list[Any]] = defaultdict(list)
        self._busy = False
        self._thread: threading.Thread | None = None
        self._pid = 0

    def submit(self, part: str, using: str, ids: Sequence[Any]) -> None:
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
            self._pending[(part, using)].extend(ids)
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
                for (part, using), ids in batch.items():
                    dispatch_now(part, using, ids)
                # A quiet process publishes each trigger at once; a busy one
                # publishes at most one per window, carrying every id that
                # committed meanwhile: under load triggers stop costing the
                # committing threads (and the workers) anything per row.
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
    os.register_at_fork(after_in_child=_connections.reset)


def flush(timeout: float = 5.0) -> bool:
    """Publish queued background triggers now (tests, shutdown); False on timeout."""
    return _background.flush(timeout)


atexit.register(flush, 2.0)
