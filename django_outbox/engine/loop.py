"""The long-running worker loop (``outbox_relay`` and its kin) and its NOTIFY waiter."""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, Error, connections

from django_outbox.engine import heartbeat, sweeps
from django_outbox.engine.runner import Runner, RunResult

logger = logging.getLogger("django_outbox.worker")


#: A worker process's first-generation threshold of the cyclic garbage collector
#: (Python's default: 700 container objects allocated and not yet freed). A batch
#: holds thousands of live rows, instances and results; with the default, a young
#: collection walked them every few hundred allocations, about 4% of the instructions
#: a no-op job costs ``jobs_worker`` (``make bench-jobs-instructions``). Objects freed by
#: reference counting never reach a collection, so only cyclic garbage waits longer.
YOUNG_COLLECTION_THRESHOLD = 10_000


def settle_heap() -> None:
    """Before a worker process's loop: collect what start-up left, then freeze the rest
    (modules, settings, URL patterns, the app registry) out of the cyclic garbage
    collector's sight. Those objects live as long as the process, and without this each
    full collection walks them all again: on the relay's path that was about a tenth of
    the CPU a message costs. Young collections then come every
    ``YOUNG_COLLECTION_THRESHOLD`` allocations. Called by the worker commands, once,
    never by library code (a test process would never collect what it froze)."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, oldest)


class Waiter:
    """Sleeps between polls; ``wake()`` (from another thread) ends the sleep early, and
    subclasses also wake on a database notification."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.woken = threading.Event()

    def wake(self) -> None:
        """End the current (or next) wait now: there is work (rows were rescued)."""
        self.woken.set()

    def _sleep(self, seconds: float) -> bool:
        """Sleep up to *seconds*; True if woken or stopped."""
        if self.woken.wait(seconds) or self.stop.is_set():
            self.woken.clear()
            return True
        return False

    def wait(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._sleep(min(remaining, 0.5)):
                return

    def close(self) -> None:
        pass


class PostgresWaiter(Waiter):
    """Waits on ``LISTEN channel`` so a commit's ``pg_notify`` wakes the worker at once.

    Only notifications for its part (the payload names it) or with no payload
    wake it.

    If the listening connection drops (restart, failover), it falls back to
    sleeping and reconnects on the next wait: a lost connection only costs
    the wake-ups until then, never the relay.
    """

    def __init__(self, stop: threading.Event, using: str, channel: str, part: str) -> None:
        super().__init__(stop)
        self.using = using
        self.channel = channel
        self.part = part
        self.conn: Any = None
        self._connect()

    def _connect(self) -> None:
        from django_outbox.engine.declarations import connect_beside

        self.conn = connect_beside(self.using)
        self.conn.execute(f'LISTEN "{self.channel}"')

    def wait(self, seconds: float) -> None:
        import psycopg

        deadline = time.monotonic() + seconds
        try:
            if self.conn is None:
                self._connect()
            # Wake at least every half second to notice a stop or a wake().
            while not self.stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._sleep(0):
                    return
                for notify in self.conn.notifies(timeout=min(remaining, 0.5), stop_after=1):
                    if notify.payload in ("", self.part):
                        return
        except (psycopg.Error, DatabaseError) as exc:
            logger.warning("LISTEN connection lost (%s); polling until it is back", exc)
            self.close()
            self.stop.wait(max(deadline - time.monotonic(), 0))

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


class WorkerLoop:
    """Drains a part, rescues expired leases every ``sweep_interval``, sleeps when idle.

    While it runs, the process has a heartbeat (see ``engine.heartbeat``):
    its claims carry its worker id, and if it dies its rows come back within
    ``WORKER_TIMEOUT_SECONDS``.
    """

    def __init__(
        self,
        runner: Runner,
        *,
        interval: float = 1.0,
        sweep_interval: float = 10.0,
        until_empty: bool = False,
        max_batches: int | None = None,
        listen: bool = True,
        report: Callable[[RunResult], Any] | None = None,
        heartbeat: bool = True,
    ) -> None:
        self.runner = runner
        self.heartbeat = heartbeat
        self.interval = interval
        self.sweep_interval = sweep_interval
        self.until_empty = until_empty
        self.max_batches = max_batches
        self.listen = listen
        self.report = report
        # The runner's part sees the same event: a stop ends its step after the row in
        # hand, not after the whole drain.
        self.stopping = runner.part.stopping
        self.errors = 0
        #: Seconds to wait after a failed iteration before the next one.
        self.retry_delay = max(interval, 1.0)

    def stop(self, *args: Any) -> None:
        """Finish the current batch, then return from ``run`` (safe from a signal handler)."""
        self.stopping.set()

    def _waiter(self) -> Waiter:
        part = self.runner.part
        if self.listen and connections[part.using].vendor == "postgresql":
            try:
                return PostgresWaiter(
                    self.stopping, part.using, part.settings.notify_channel, part.name
                )
            except Exception:
                logger.exception("LISTEN failed; polling every %ss instead", self.interval)
        return Waiter(self.stopping)

    def run(self) -> RunResult:
        """Loop until stopped (or until nothing is due, with ``until_empty``)."""
        part = self.runner.part
        total = self.runner.result_class()
        waiter = self._waiter()
        if self.heartbeat:
            heartbeat.start(part.worker_role(), part.using).on_rescue(part.name, waiter.wake)
        next_sweep = 0.0
        outage = Outage(part.name)
        try:
            while not self.stopping.is_set():
                try:
                    # What a failed iteration left unwritten first (outcomes, releases).
                    self.runner.settle()
                    if time.monotonic() >= next_sweep:
                        sweeps.rescue_stuck(part)
                        self._maintain()
                        next_sweep = time.monotonic() + self.sweep_interval
                    left = None if self.max_batches is None else self.max_batches - total.batches
                    result = self.runner.drain(max_batches=left)
                except Error as exc:
                    # A database restart or failover must not end the worker: what it
                    # held is written back when the database returns, or rescued.
                    self.errors += 1
                    outage.failed(exc, self.retry_delay)
                    connections[part.using].close()
                    self.stopping.wait(self.retry_delay)
                    continue
                outage.recovered()
                total += result
                if result.claimed and self.report:
                    self.report(result)
                if self.max_batches is not None and total.batches >= self.max_batches:
                    break
                if result.claimed < self.runner.batch_size:
                    if self.until_empty:
                        break
                    wait = self.interval
                    wake = part.next_wake()
                    if wake is not None:
                        wait = min(wait, wake)
                    waiter.wait(max(wait, 0.05))  # an idle poll, not a busy loop
        finally:
            waiter.close()
            if self.heartbeat:
                heartbeat.stop()
        return total

    def _maintain(self) -> None:
        """The part's periodic work; its failure is logged, never the loop's end."""
        try:
            self.runner.part.maintain()
        except Error:
            raise  # the database: the loop's outage handling says it once
        except Exception:
            logger.exception("%s maintenance failed; the loop goes on", self.runner.part.name)


class Outage:
    """Says a failure once per episode (with its traceback), and when it ends."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.since: float | None = None
        self.failures = 0

    def failed(self, exc: BaseException, retry_in: float) -> None:
        self.failures += 1
        if self.since is None:
            self.since = time.monotonic()
            logger.error(
                "%s iteration failed (%s: %s); retrying every %gs, quiet until it works",
                self.what,
                type(exc).__name__,
                exc,
                retry_in,
                exc_info=exc,
            )
        else:
            logger.debug("%s iteration failed again: %s", self.what, exc)

    def recovered(self) -> None:
        if self.since is None:
            return
        logger.warning(
            "%s works again after %.1f s (%d failed iteration(s))",
            self.what,
            time.monotonic() - self.since,
            self.failures,
        )
        self.since = None
        self.failures = 0
