"""Worker heartbeats: the rows of a dead worker come back in seconds, not after a lease.

A long lease protects a slow worker; a short one rescues a dead worker's
rows fast. Heartbeats give both. Each worker process runs a daemon thread
that writes its row in ``django_outbox_worker`` with the database's clock
every ``HEARTBEAT_SECONDS`` (1 s): the long-running commands built on
``WorkerLoop`` (``outbox_relay``, ``jobs_worker``, and ``inbox_consume``
when it has no kombu source), and a Celery worker process from the first
delivery, handling, job or sweep task it runs (not eager or direct calls).
The process stamps every row it claims under a lease (outbox messages,
jobs) with its id; the inbox claims under row locks, which die with the
connection, and needs no stamp.

A worker whose heartbeat is older than ``WORKER_TIMEOUT_SECONDS`` (3 s) is
dead: the next beat of any live worker rescues its running rows (back to
ready, or held where the part's policy says so), deletes its worker row and
wakes the part's runners (this process's loop at once, others through a
trigger). A worker that is merely slow (its main thread blocked in a
transport or a long job) keeps beating: it keeps its rows for the whole
lease, and where the part extends leases (jobs) the beat renews the leases
of the rows it runs, so a long job keeps them however long it takes. A
frozen worker (SIGSTOP) stops beating and loses its rows; when it resumes,
it finds its row gone, logs that it was declared dead and writes a new one,
and the lease token fences out what it still records.

A rescuer only judges others after it has itself beaten without failure for a
whole timeout (measured on its own monotonic clock), so after a database
outage, when every heartbeat is stale, nobody rescues a live worker's rows
before that worker had the chance to beat. The thread also warns, once per
episode, when a part with unfinished rows has not been swept for
``SWEEP_STALE_SECONDS``.

The price: one UPDATE per beat and process, and once healthy one query for
stale workers per beat (plus a lease-renewing UPDATE per part that extends
leases).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction

from django_outbox.conf import get_settings
from django_outbox.engine import clock
from django_outbox.engine.models import Worker

logger = logging.getLogger("django_outbox.heartbeat")


class Heartbeat:
    """This process's worker row, kept fresh by a daemon thread."""

    def __init__(self, role: str, using: str = DEFAULT_DB_ALIAS) -> None:
        self.id = uuid.uuid4()
        self.name = f"{socket.gethostname()}:{os.getpid()} {role}"[:255]
        self.using = using
        self.pid = os.getpid()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: ``time.monotonic()`` since when every beat succeeded (``None``: the last failed).
        self.healthy_since: float | None = None
        self.beats = 0
        self.rescued = 0
        #: Parts whose missing sweep this process has warned about (once per episode).
        self.warned_sweeps: set[str] = set()
        self._next_sweep_check = 0.0
        self._listeners: dict[str, list[Callable[[], Any]]] = {}

    def on_rescue(self, part: str, callback: Callable[[], Any]) -> None:
        """Call *callback* (from the heartbeat thread) after this process rescued rows of
        *part*: the worker loop wakes at once instead of at its next poll."""
        self._listeners.setdefault(part, []).append(callback)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.pid == os.getpid()

    def start(self) -> Heartbeat:
        """Write the worker row and start beating (returns at once)."""
        self.beat()
        self._thread = threading.Thread(
            target=self._run, name="django-outbox-heartbeat", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating and remove the worker row (a clean exit leaves nothing to rescue)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        try:
            Worker.objects.using(self.using).filter(pk=self.id).delete()
        except DatabaseError:
            logger.warning("could not remove worker row %s; it will be swept", self.id)

    def beat(self) -> None:
        """Write ``heartbeat_at = now()``; re-create the row if a rescuer removed it."""
        workers = Worker.objects.using(self.using)
        now = clock.now()
        if workers.filter(pk=self.id).update(heartbeat_at=now) == 0:
            if self.beats:
                logger.warning(
                    "worker %s was declared dead (frozen or cut off for longer than "
                    "WORKER_TIMEOUT_SECONDS); its rows were rescued, and what it still records "
                    "is fenced out",
                    self.name,
                )
            workers.create(id=self.id, name=self.name, started_at=now, heartbeat_at=now)
        self.beats += 1

    def _run(self) -> None:
        try:
            while not self._stop.wait(get_settings().heartbeat_seconds):
                self._tick()
        finally:
            connections[self.using].close()

    def _tick(self) -> None:
        config = get_settings()
        try:
            self.beat()
        except DatabaseError as exc:
            self.healthy_since = None
            logger.warning("heartbeat failed (%s); retrying", exc)
            connections[self.using].close()
            return
        try:
            self.extend_leases()
        except DatabaseError:
            logger.exception("extending the leases of this worker's rows failed; retrying")
            connections[self.using].close()
        if self.healthy_since is None:
            self.healthy_since = time.monotonic()
            return
        if time.monotonic() - self.healthy_since < config.worker_timeout_seconds:
            return
        try:
            rescued = rescue_dead_workers(self.using, exclude=self.id)
        except DatabaseError:
            logger.exception("rescuing the rows of dead workers failed; retrying")
            connections[self.using].close()
            return
        for part, count in rescued.items():
            self.rescued += count
            for callback in self._listeners.get(part, ()):
                callback()
        if time.monotonic() - self.healthy_since >= config.sweep_stale_seconds:
            self.check_sweeps()

    def extend_leases(self) -> int:
        """Renew the leases of rows this worker runs, for parts whose steps may outlast a
        lease (``Part.extends_leases``): a live worker keeps its long jobs, a dead or
        frozen one stops renewing and loses them. A lease is renewed once a beat has
        passed since it was set, to at least three beats ahead (``Part.lease_seconds``),
        so one late beat never lets it run out."""
        from django_outbox.engine.part import lease_floor, registered

        settings = get_settings()
        beat = settings.heartbeat_seconds
        extended = 0
        for part_class in registered().values():
            life = part_class.lifecycle
            if not part_class.extends_leases or life.running is None:
                continue
            lease = max(settings.engine(part_class.name).lease_seconds, lease_floor(beat))
            now = clock.now()
            extended += (
                part_class.model._default_manager.using(self.using)
                .filter(
                    state=life.running,
                    claimed_by=self.id,
                    locked_until__lt=clock.later(now, lease - beat),
                )
                .update(locked_until=clock.later(now, lease))
            )
        return extended

    def check_sweeps(self, *, force: bool = False) -> None:
        """Warn once when a part with unfinished rows has not been swept for
        ``SWEEP_STALE_SECONDS``; say when its sweeps are back. Runs at most every
        few seconds (*force* checks now)."""
        from django_outbox.engine.sweeps import stale_sweeps

        config = get_settings()
        if not force and time.monotonic() < self._next_sweep_check:
            return
        self._next_sweep_check = time.monotonic() + min(30.0, config.sweep_stale_seconds / 2)
        try:
            stale = {found.part: found for found in stale_sweeps(self.using)}
        except DatabaseError:
            logger.exception("checking the sweep marks failed; retrying")
            connections[self.using].close()
            return
        for part in sorted(stale.keys() - self.warned_sweeps):
            logger.warning("%s", stale[part].describe())
        for part in sorted(self.warned_sweeps - stale.keys()):
            logger.info("%s: sweeps run again (or nothing waits for one)", part)
        self.warned_sweeps = set(stale)


def rescue_dead_workers(using: str = DEFAULT_DB_ALIAS, *, exclude: Any = None) -> dict[str, int]:
    """Rescue the running rows of every worker whose heartbeat is older than the timeout.

    Rows go back to ready (or are held, per the part's policy) and the part's
    runners are woken; the dead workers' rows in the worker table are removed.
    Returns how many rows were made ready again, per part.
    """
    from django_outbox.engine import sweeps, triggers
    from django_outbox.engine.part import registered

    config = get_settings()
    stale = clock.later(clock.now(), -config.worker_timeout_seconds)
    workers = Worker.objects.using(using)
    dead = list(
        workers.filter(heartbeat_at__lt=stale).exclude(pk=exclude).values_list("pk", flat=True)
    )
    if not dead:
        return {}
    rescued: dict[str, int] = {}
    for name, part_class in registered().items():
        result = sweeps.rescue_stuck(part_class(using=using), dead_workers=dead)
        if result.resent:
            rescued[name] = result.resent
            triggers.dispatch(name, using, [])
    with transaction.atomic(using=using):
        workers.filter(pk__in=dead, heartbeat_at__lt=stale).delete()
    return rescued


_lock = threading.Lock()
_current: Heartbeat | None = None


def start(role: str, using: str = DEFAULT_DB_ALIAS) -> Heartbeat:
    """Start this process's heartbeat (once; a forked child starts its own)."""
    global _current
    with _lock:
        if _current is None or not _current.alive:
            _current = Heartbeat(role, using).start()
        return _current


def stop() -> None:
    """Stop this process's heartbeat, if it runs."""
    global _current
    with _lock:
        current, _current = _current, None
    if current is not None and current.pid == os.getpid():
        current.stop()


def current_worker_id() -> uuid.UUID | None:
    """The id that this process's claims carry, or ``None`` if it has no heartbeat.

    Rows claimed without a worker id (a relay run inside a web process or a
    test) are rescued when their lease expires, not sooner.
    """
    current = _current
    if current is not None and current.alive:
        return current.id
    return None
