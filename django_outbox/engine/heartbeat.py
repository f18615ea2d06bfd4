"""Worker heartbeats: the rows of a dead worker come back in seconds, not after a lease.

A long lease protects a slow worker; a short one rescues a dead worker's
rows fast. Heartbeats give both: each worker process (``outbox_relay``,
``inbox_worker``, ``inbox_consume``, ``jobs_worker``, every Celery worker
process that runs our tasks) runs a daemon thread that writes its row in
``django_outbox_worker`` with the database's clock every
``HEARTBEAT_SECONDS`` (1 s), and its claims carry its worker id. A worker
whose heartbeat is older than ``WORKER_TIMEOUT_SECONDS`` (3 s) is dead (or
cut off): its running rows are rescued at once by any process that can prove
the database was reachable meanwhile, and the part's runners are woken. A
worker that is merely slow (its main thread blocked in a transport or a long
job) keeps beating and keeps its rows. A frozen worker (SIGSTOP) stops
beating and loses its rows; when it resumes, the lease token fences it out.

Proof that the database was reachable: each worker row records since when
its beats have all succeeded (``healthy_since``). A worker silent for longer
than the timeout is judged dead only while another worker has been beating
without a gap for longer than the timeout: after a database outage, when
every heartbeat is stale, nobody's rows are taken before their worker had the
chance to beat again. Any process may rescue by that rule: a heartbeat
thread, a Celery beat sweep task, the ``outbox_sweep``, ``inbox_sweep`` and
``jobs_sweep`` commands.

The heartbeat thread also tends the leases its process works on (each
runner registers them, see :class:`Held`): it renews only the rows a step is
running now (for parts whose steps may outlast a lease: jobs), and when a
step has run longer than ``HANDBACK_SECONDS`` it gives the rows of that batch
not yet started back, so idle workers take them. A lease nobody works on any
more (its batch raised, its process lost the database) is not renewed: it
runs out, and the rows come back.

The price: one UPDATE per beat and process, one query for dead workers per
beat, and an UPDATE per part with running rows whose leases it renews.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.models import Exists, OuterRef, Q

from django_outbox.conf import get_settings
from django_outbox.engine import clock, telemetry
from django_outbox.engine.models import Worker

if TYPE_CHECKING:
    from django_outbox.engine.lease import Lease
    from django_outbox.engine.part import Part

logger = logging.getLogger("django_outbox.heartbeat")


class Held:
    """A batch this process works on under a lease: which of its rows have not started
    (they may be handed back), which are running (their lease is renewed), and since
    when the current step runs (or the batch waits).

    The runner's thread and the heartbeat thread share it under ``lock``: a row is
    either started by the runner or handed back by the heartbeat, never both.
    """

    def __init__(self, part: Part, lease: Lease, ids: Iterable[Any]) -> None:
        self.part = part
        self.lease = lease
        self.lock = threading.Lock()
        self.unstarted: set[Any] = set(ids)
        self.running: tuple[Any, ...] = ()
        #: ``time.monotonic()`` when the current step started, or the batch was claimed.
        self.since = time.monotonic()
        #: Rows the heartbeat gave back: no longer this batch's.
        self.handed_back: set[Any] = set()

    def begin(self, ids: Iterable[Any]) -> list[Any]:
        """The step starts on *ids* now: those still unstarted (not handed back) are
        returned and become the running rows."""
        with self.lock:
            started = [pk for pk in ids if pk in self.unstarted]
            self.unstarted.difference_update(started)
            self.running = tuple(started)
            self.since = time.monotonic()
        return started

    def begin_one(self, pk: Any) -> bool:
        """``begin([pk])`` for one row (a job of a window, started as it comes): whether it
        was still unstarted, and is now the running row."""
        with self.lock:
            if pk not in self.unstarted:
                return False
            self.unstarted.discard(pk)
            self.running = (pk,)
            self.since = time.monotonic()
        return True

    def end_step(self) -> None:
        """Nothing of the batch runs now (its outcomes are being recorded). One
        assignment, atomic without the lock: the heartbeat reads the running rows
        before or after it, as it would around the lock."""
        self.running = ()

    def take_unstarted(self, older_than: float) -> list[Any]:
        """The rows not started yet if the current step (or the wait) has lasted
        *older_than* seconds; they stop being this batch's."""
        with self.lock:
            if not self.unstarted or time.monotonic() - self.since < older_than:
                return []
            tail = list(self.unstarted)
            self.unstarted.clear()
            self.handed_back.update(tail)
        return tail


class Heartbeat:
    """This process's worker row, kept fresh by a daemon thread."""

    def __init__(self, role: str, using: str = DEFAULT_DB_ALIAS) -> None:
        self.id = uuid.uuid4()
        self.name = f"{socket.gethostname()}:{os.getpid()} {role}"[:255]
        self.using = using
        self.pid = os.getpid()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Whether the last beat failed (the next one starts a new healthy streak).
        self._streak_broken = True
        self.beats = 0
        self.rescued = 0
        self.handed_back = 0
        #: Parts whose missing sweep this process has warned about (once per episode).
        self.warned_sweeps: set[str] = set()
        self._next_sweep_check = 0.0
        self._listeners: dict[str, list[Callable[[], Any]]] = {}
        self._held: dict[uuid.UUID, Held] = {}
        self._held_lock = threading.Lock()
        #: Releases of handed-back rows that failed; tried again every beat.
        self._unreleased: list[tuple[Held, list[Any]]] = []

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
            telemetry.flush(self.using)
        except DatabaseError:
            logger.warning("could not write the last per-minute counts of %s", self.name)
        try:
            Worker.objects.using(self.using).filter(pk=self.id).delete()
        except DatabaseError:
            logger.warning("could not remove worker row %s; it will be swept", self.id)

    # -- the leases this process works on -------------------------------------------

    def hold(self, held: Held) -> None:
        with self._held_lock:
            self._held[held.lease.token] = held

    def let_go(self, held: Held) -> None:
        with self._held_lock:
            self._held.pop(held.lease.token, None)

    def holding(self) -> list[Held]:
        with self._held_lock:
            return list(self._held.values())

    # -- beating ---------------------------------------------------------------------

    def beat(self) -> None:
        """Write ``heartbeat_at = now()`` (and start a new healthy streak after a failed
        beat); re-create the row if a rescuer removed it."""
        workers = Worker.objects.using(self.using)
        now = clock.now()
        values: dict[str, Any] = {"heartbeat_at": now}
        if self._streak_broken:
            values["healthy_since"] = now
        if workers.filter(pk=self.id).update(**values) == 0:
            if self.beats:
                logger.warning(
                    "worker %s was declared dead (frozen or cut off for longer than "
                    "WORKER_TIMEOUT_SECONDS); its rows were rescued, and what it still records "
                    "is fenced out",
                    self.name,
                )
            workers.create(
                id=self.id, name=self.name, started_at=now, heartbeat_at=now, healthy_since=now
            )
        self._streak_broken = False
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
            if not self._streak_broken:
                logger.warning("heartbeat failed (%s); retrying every beat", exc)
            self._streak_broken = True
            connections[self.using].close()
            return
        for step in (self.extend_leases, self.hand_back):
            try:
                step()
            except DatabaseError:
                logger.warning("%s failed; retrying", step.__name__, exc_info=True)
                connections[self.using].close()
                return
        try:
            rescued = rescue_dead_workers(self.using, exclude=self.id)
        except DatabaseError:
            logger.warning("rescuing the rows of dead workers failed; retrying", exc_info=True)
            connections[self.using].close()
            return
        for part, count in rescued.items():
            self.rescued += count
            for callback in self._listeners.get(part, ()):
                callback()
        if self.beats * config.heartbeat_seconds >= config.sweep_stale_seconds:
            self.check_sweeps()
        try:
            telemetry.flush(self.using)
        except DatabaseError:
            logger.warning("could not write the per-minute counts; retrying", exc_info=True)
            connections[self.using].close()

    def extend_leases(self) -> int:
        """Renew the leases of the rows a step of this process is running now, for parts
        whose steps may outlast a lease (``Part.extends_leases``): a live worker keeps
        its long job, a dead or frozen one stops renewing and loses it, and a batch
        nobody works on any more (it raised, its database went away) is not renewed.
        A lease is renewed once a beat has passed since it was set, to at least three
        beats ahead (``Part.lease_seconds``), so one late beat never lets it run out."""
        beat = get_settings().heartbeat_seconds
        running: dict[tuple[type[Any], str], tuple[Part, set[Any], set[Any]]] = {}
        for held in self.holding():
            part = held.part
            if not part.extends_leases or not held.running:
                continue
            key = (part.model, part.using)
            entry = running.setdefault(key, (part, set(), set()))
            entry[1].add(held.lease.token)
            entry[2].update(held.running)
        extended = 0
        for part, tokens, ids in running.values():
            lease = part.lease_seconds()
            now = clock.now()
            extended += (
                part.model._default_manager.using(part.using)
                .filter(
                    pk__in=list(ids),
                    lock_token__in=list(tokens),
                    state=part.lifecycle.running,
                    locked_until__lt=clock.later(now, lease - beat),
                )
                .update(locked_until=clock.later(now, lease))
            )
        return extended

    def hand_back(self) -> int:
        """Give back the unstarted rows of batches whose current step (or wait) has run
        longer than ``HANDBACK_SECONDS``, and wake the part's runners: no row waits
        behind a long one while another worker is free."""
        from django_outbox.engine.lease import fenced, with_ids
        from django_outbox.engine.transitions import release_values

        retry, self._unreleased = self._unreleased, []
        for held in self.holding():
            part = held.part
            if part.lifecycle.running is None:
                continue  # lock mode: rows under a transaction's locks are not handed back
            tail = held.take_unstarted(part.config.handback_seconds)
            if tail:
                retry.append((held, tail))
        given = 0
        woken: set[str] = set()
        for index, (held, tail) in enumerate(retry):
            part = held.part
            rows = fenced(part.model, held.lease, part.lifecycle.running or "", part.using)
            try:
                count = with_ids(rows, tail).update(**release_values(part))
            except DatabaseError:
                self._unreleased.extend(retry[index:])
                raise
            given += count
            if count and part.name not in woken:
                woken.add(part.name)
                part.logger.info(
                    "gave back %d %s row(s) not started behind a step running over %g s",
                    count,
                    part.name,
                    part.config.handback_seconds,
                )
                part.wake()
        self.handed_back += given
        return given

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
            logger.warning("checking the sweep marks failed; retrying", exc_info=True)
            connections[self.using].close()
            return
        for part in sorted(stale.keys() - self.warned_sweeps):
            logger.warning("%s", stale[part].describe())
        for part in sorted(self.warned_sweeps - stale.keys()):
            logger.info("%s: sweeps run again (or nothing waits for one)", part)
        self.warned_sweeps = set(stale)


def dead_workers(using: str = DEFAULT_DB_ALIAS, *, exclude: Any = None) -> list[uuid.UUID]:
    """Workers silent for longer than ``WORKER_TIMEOUT_SECONDS`` while another worker
    has been beating without a gap for longer than that (the database was reachable,
    so they could have beaten): dead, frozen or cut off."""
    config = get_settings()
    now = clock.now()
    stale = clock.later(now, -config.worker_timeout_seconds)
    recent = clock.later(now, -2 * config.heartbeat_seconds)
    witness = Worker.objects.using(using).filter(
        ~Q(pk=OuterRef("pk")), heartbeat_at__gte=recent, healthy_since__lte=stale
    )
    silent = Worker.objects.using(using).filter(heartbeat_at__lt=stale).filter(Exists(witness))
    if exclude is not None:
        silent = silent.exclude(pk=exclude)
    return list(silent.values_list("pk", flat=True))


def rescue_dead_workers(using: str = DEFAULT_DB_ALIAS, *, exclude: Any = None) -> dict[str, int]:
    """Rescue the running rows of every dead worker (see :func:`dead_workers`).

    Rows a step had not started go back uncounted; rows whose attempt had started are
    recorded as ended uncleanly (retried, or dead-lettered once their attempts are used
    up, or held where the part holds uncertain rows). The part's runners are woken and
    the dead workers' rows removed. Returns how many rows were made ready again, per
    part.
    """
    from django_outbox.engine import sweeps
    from django_outbox.engine.part import registered

    dead = dead_workers(using, exclude=exclude)
    if not dead:
        return {}
    rescued: dict[str, int] = {}
    for name, part_class in registered().items():
        part = part_class(using=using)
        result = sweeps.rescue_stuck(part, dead_workers=dead)
        if result.ready:
            rescued[name] = result.ready
            part.wake()
    config = get_settings()
    stale = clock.later(clock.now(), -config.worker_timeout_seconds)
    with transaction.atomic(using=using):
        Worker.objects.using(using).filter(pk__in=dead, heartbeat_at__lt=stale).delete()
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


def start_for_task(request: Any) -> None:
    """Start this Celery worker process's heartbeat from one of our tasks (*request* is
    the task's ``request``; not for eager or direct calls, which run in the caller)."""
    if request.called_directly or request.is_eager:
        return
    try:
        start("celery")
    except DatabaseError:
        # The task meets the same database and says so; its claims carry no worker id
        # meanwhile (their leases protect them).
        logger.debug("no heartbeat: the database is away", exc_info=True)


def stop() -> None:
    """Stop this process's heartbeat, if it runs (and close this thread's declarations
    connections: without a heartbeat, starts are declared otherwise)."""
    global _current
    from django_outbox.engine import declarations

    declarations.forget_all()
    with _lock:
        current, _current = _current, None
    if current is not None and current.pid == os.getpid():
        current.stop()


def current() -> Heartbeat | None:
    """This process's running heartbeat, if any."""
    beating = _current
    if beating is not None and beating.alive:
        return beating
    return None


def current_worker_id() -> uuid.UUID | None:
    """The id that this process's claims carry, or ``None`` if it has no heartbeat.

    Rows claimed without a worker id (a relay run inside a web process or a
    test) are rescued when their lease expires, not sooner.
    """
    beating = current()
    return beating.id if beating is not None else None


def hold(part: Part, lease: Lease, ids: Iterable[Any]) -> Held:
    """Register a claimed batch with this process's heartbeat (if it runs), which then
    renews what runs and hands back what waits too long."""
    held = Held(part, lease, ids)
    beating = current()
    if beating is not None:
        beating.hold(held)
    return held


def let_go(held: Held) -> None:
    """The batch is finished with (recorded, released or abandoned): stop tending it."""
    beating = current()
    if beating is not None:
        beating.let_go(held)
