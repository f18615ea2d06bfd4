"""The interface a part (outbox, inbox, jobs) implements to be driven by the engine.

A part says, in a few lines, which rows are due, what doing one batch
means, and how a finished row is marked; the engine does the rest: claiming
under a lease, fencing, backoff, dead-lettering, releasing, draining,
rescuing and purging. A part is a plain class over one model::

    class Relay(Part):
        name = "outbox"
        model = OutboxMessage
        lifecycle = Lifecycle(ready="should_be_sent", running="sending", done="sent",
                              failed="send_error", finished=("sent", "cancelled"))

        def process(self, rows, attempt):
            for chunk in ...:
                chunk = attempt.start(chunk)   # the attempt counts from here
                ...  # publish; yield {pk: DONE, Retry(...), ...} as outcomes come in

What the engine's states mean for every part, and who moves rows between
them, is in ``engine.transitions``; how outcomes are named, in
``engine.outcomes``.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Protocol

from django.db import DEFAULT_DB_ALIAS, models
from django.db.models import Q

from django_outbox.conf import EngineSettings, Settings, get_settings
from django_outbox.engine import clock
from django_outbox.engine.outcomes import Done, Fail, Outcomes, Retry, Uncertain


class Attempt(Protocol):
    """What a step sees of its batch (``engine.runner.LeaseAttempt`` in lease mode,
    ``engine.locked.LockedAttempt`` in lock mode)."""

    #: ``time.monotonic()`` after which the step starts nothing new.
    deadline: float

    def start(self, rows: Sequence[Any], *, begin: bool = True) -> list[Any]:
        """Count the attempt of *rows* as started; return those the step may do."""
        ...

    def begin(self, row: Any) -> bool:
        """The step starts on *row* (declared ahead with ``begin=False``) now."""
        ...

    def idle(self) -> None:
        """Nothing of the batch runs now."""
        ...

    @property
    def starts_are_cheap(self) -> bool:
        """Whether declaring a start costs no round trip (declare each row alone)."""
        ...


@dataclass(frozen=True)
class Lifecycle:
    """A part's state names mapped onto the engine's roles (the names are the part's)."""

    #: Waiting for ``available_at``; claimed from here.
    ready: str
    #: Claimed under a lease; ``None`` for a part that runs its step under the row
    #: lock, inside the claiming transaction (lock mode: nothing to rescue).
    running: str | None
    #: Finished successfully.
    done: str
    #: Dead-lettered: waits for an operator.
    failed: str
    #: States the purge deletes after retention (``done`` and cancelled-like states).
    finished: tuple[str, ...]
    #: Where a ``Skip`` outcome puts a row (lock-mode parts).
    skipped: str | None = None


@dataclass(frozen=True)
class KeyOrdering:
    """Rows with the same key run one at a time in ``sequence`` order.

    The rows of a key whose head failed are *parked* (``blocked``), out of the
    due index, until the head finishes: a key that waits on an operator costs
    the claims of other keys nothing. The counter model (one row per key, with
    the key fields and ``blocked``) tells new rows of a parked key to park.
    """

    #: Columns that together name a key, e.g. ``("destination", "key")``.
    key_fields: tuple[str, ...]
    sequence_field: str
    #: States in which a row still holds back the later rows of its key.
    blocking_states: tuple[str, ...]
    #: One row per key: the key fields and a ``blocked`` boolean.
    counter: type[models.Model]
    #: The counter's names for ``key_fields`` (default: the same names).
    counter_fields: tuple[str, ...] | None = None
    #: Whether a row whose ``blocking`` flag is set holds its key back in any state (a
    #: part whose dead-letter state is also a final one: jobs end FAILED).
    flag_blocks: bool = False

    def counter_key(self, slot: tuple[Any, ...]) -> dict[str, Any]:
        """The counter row's lookup for a key (its values in ``key_fields`` order)."""
        return dict(zip(self.counter_fields or self.key_fields, slot, strict=True))

    def holding(self) -> Q:
        """Rows that hold back the later rows of their key."""
        held = Q(state__in=self.blocking_states)
        return held | Q(blocking=True) if self.flag_blocks else held


class PartLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A part's logger: every line carries ``part`` (and what the call adds) as
    structured fields, for JSON formatters and Sentry's logging integration."""

    def __init__(self, logger: logging.Logger, part: str) -> None:
        super().__init__(logger, {"part": part})

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs


class Part:
    """Base class of the three parts; subclasses set the class attributes and ``process``."""

    #: Settings section, logger suffix, trigger name: ``"outbox"``, ``"inbox"``, ``"jobs"``.
    name: ClassVar[str]
    model: ClassVar[type[models.Model]]
    lifecycle: ClassVar[Lifecycle]
    #: Columns a claim reads back (``None``: all).
    claimed_fields: ClassVar[tuple[str, ...] | None] = None
    ordering: ClassVar[KeyOrdering | None] = None
    #: Whether the heartbeat of a live worker keeps extending the leases of the rows it
    #: runs (steps that may take longer than ``LEASE_SECONDS``: jobs).
    extends_leases: ClassVar[bool] = False
    #: Whether the rows handed to the hooks carry the values just recorded (the jobs'
    #: task_finished sends them as they are); costs a few µs per row.
    hooks_see_recorded_values: ClassVar[bool] = False
    #: Whether ``done_row_values`` gives a row values of its own (a job's result).
    has_own_done_values: ClassVar[bool] = False

    def __init__(
        self,
        *,
        using: str = DEFAULT_DB_ALIAS,
        batch_size: int | None = None,
        config: Settings | None = None,
        clock: Any = None,
        rng: random.Random | None = None,
    ) -> None:
        self.using = using
        self.settings = config or get_settings()
        self.config: EngineSettings = self.settings.engine(self.name)
        self.batch_size = batch_size or self.config.batch_size
        #: ``None`` for the database's clock; a callable returning a datetime pins it.
        self.clock = clock
        self.rng = rng or random.Random()
        self.logger = PartLogger(logging.getLogger(f"django_outbox.{self.name}"), self.name)
        #: Set when the process is asked to stop (a worker loop's SIGTERM): a step starts
        #: nothing new, a drain claims no more; what is in hand is finished and recorded.
        self.stopping = threading.Event()

    # -- what a part says ----------------------------------------------------

    def lease_seconds(self) -> float:
        """How long a claim's lease runs. A part whose leases the heartbeat renews gets at
        least three heartbeats: a renewal must land before the lease runs out, even with
        a beat late."""
        lease = self.config.lease_seconds
        if self.extends_leases:
            return max(lease, lease_floor(self.settings.heartbeat_seconds))
        return lease

    def record_time(self, started: datetime | None = None) -> clock.Instant:
        """The time a group of outcomes is recorded with (``now()``; a part that hands the
        recorded times to others, the jobs' ``task_finished``, reads it first and records
        no finish before the group's *started*)."""
        return self.now()

    def now(self) -> clock.Instant:
        """The current time as SQL (the database's unless pinned)."""
        pinned: datetime | None = self.clock() if self.clock is not None else None
        return clock.now(pinned)

    def due(self) -> models.QuerySet[Any]:
        """Rows that may be claimed now, in the order to claim them: the part's one
        selection of due rows (parked rows of a key that waits on a failed head are not
        due; nor, in lock mode, rows under a live lease)."""
        now = self.now()
        due = self.model._default_manager.using(self.using).filter(
            state=self.lifecycle.ready, available_at__lte=now
        )
        if self.ordering is not None:
            due = due.filter(blocked=False)
        if self.lifecycle.running is None:
            due = due.filter(Q(locked_until__isnull=True) | Q(locked_until__lt=now))
        return due.order_by("available_at", "pk")

    #: What runs this part's sweep, for the warning when none does.
    sweepers: ClassVar[str] = "its Celery beat sweep task"

    #: Columns ``takes()`` reads (a follower's queue, say).
    scope_fields: ClassVar[tuple[str, ...]] = ()

    def takes(self, row: Any) -> bool:
        """Whether this runner may run *row* at all (a jobs runner: a job of its queues).
        ``due()`` applies the same rule in SQL; this is for rows found otherwise (the
        followers of a key)."""
        return True

    def worker_role(self) -> str:
        """What a worker process running this part calls itself after ``host:pid`` in
        its worker row (the health page reads the part, and the queues, from it)."""
        return self.name

    def claim_variant(self) -> Any:
        """What, besides the part, shapes ``due()`` (a hashable; compiled claims are
        cached per value): the queues a jobs runner takes, say, or the destinations
        whose circuit is open (read once per claim, passed to :meth:`narrow_claim`)."""
        return None

    def next_wake(self) -> float | None:
        """Seconds until rows the claims now leave alone may be claimed (an outbox
        destination's probe), so an idle worker loop polls then rather than after its
        whole interval; ``None``: nothing of the kind."""
        return None

    def narrow_claim(self, queryset: models.QuerySet[Any], variant: Any) -> models.QuerySet[Any]:
        """The due rows a claim takes, given this claim's *variant* (read once, so a
        compiled claim and its cache key agree): the outbox leaves out the destinations
        whose circuit is open."""
        return queryset

    def process(self, rows: Sequence[Any], attempt: Attempt) -> Iterator[Outcomes]:
        """Do the step for *rows*; yield outcomes as they come (each group is recorded
        at once). Call ``attempt.start(rows)`` just before the step starts on rows and
        do only the rows it returns; start nothing after ``attempt.deadline`` (a
        ``time.monotonic()`` value). Rows given no outcome go back unattempted.
        """
        raise NotImplementedError

    #: The field stamped when an attempt starts.
    attempted_at_field: ClassVar[str] = "attempted_at"
    #: A field stamped with the first attempt's start and then kept (jobs' ``started_at``).
    first_started_field: ClassVar[str | None] = None

    def done_values(self, now: clock.Instant | None) -> Mapping[str, Any]:
        """Extra fields set on every row that finished (besides ``state``)."""
        return {"finished_at": now}

    def max_attempts(self, row: Any) -> int:
        """Attempts allowed before a retryable failure becomes final."""
        return self.config.max_attempts

    def retry_delays(self, row: Any) -> tuple[float, float]:
        """The backoff of *row*'s retries: base and maximum delay in seconds."""
        return self.config.retry_base_seconds, self.config.retry_max_seconds

    def holds_uncertain(self, row: Any) -> bool:
        """Whether an uncertain outcome parks *row* for an operator instead of retrying."""
        return False

    def failed_values(self, row: Any, outcome: Retry | Fail | Uncertain) -> Mapping[str, Any]:
        """Extra fields set on a row whose attempt failed (a traceback, say), from the
        outcome's ``details``."""
        return {}

    def done_row_values(self, row: Any, outcome: Done) -> Mapping[str, Any]:
        """Extra fields of *row*'s own set when it finished (a job's return value);
        rows with the same values share one UPDATE."""
        return {}

    def dead_values(self, row: Any, now: clock.Instant) -> Mapping[str, Any]:
        """Extra fields set on a row dead-lettered (a job's ``finished_at``)."""
        return {}

    def held_values(self, row: Any, now: clock.Instant) -> Mapping[str, Any]:
        """Extra fields set on a row held because its outcome is uncertain."""
        return {}

    def requeue_values(self) -> Mapping[str, Any]:
        """Extra fields an operator's requeue resets (the outbox's ``uncertain`` mark)."""
        return {}

    # -- hooks (signals, logs); no-ops by default ------------------------------

    def log_fields(self, row: Any) -> dict[str, Any]:
        """The structured fields of a log line about *row*, passed as ``extra`` so JSON
        loggers and Sentry index them: ``part``, ``id`` (the id people search for),
        ``type`` (or the task), where it goes or comes from (``destination``, ``source``,
        ``queue``), ``key``, ``attempt`` and ``worker`` (this process's worker id)."""
        from django_outbox.engine import heartbeat

        worker = heartbeat.current_worker_id()
        return {
            "part": self.name,
            "id": str(row.pk),
            "attempt": getattr(row, "attempts", None),
            "worker": str(worker) if worker is not None else None,
        }

    def log_failure(self, row: Any, text: str, will_retry: bool, *args: Any) -> None:
        """One line per failed attempt: WARNING while it will be retried, ERROR once
        when it is dead-lettered (or held); with :meth:`log_fields`."""
        level = logging.WARNING if will_retry else logging.ERROR
        fields = self.log_fields(row)
        fields["will_retry"] = will_retry
        self.logger.log(level, text, *args, extra=fields)

    def on_done(self, rows: Sequence[Any]) -> None:
        """Called with the rows this process recorded as done."""

    def on_failed(self, row: Any, error: str, will_retry: bool) -> None:
        """Called once per failed attempt that was recorded."""

    def on_recorded(self, changes: Sequence[Any]) -> None:
        """Called with every change of a group once it is committed (lock mode: the inbox
        wakes messages it deferred whose predecessor committed meanwhile)."""

    def on_rescued(self, result: Any) -> None:
        """Called after a rescue moved rows (a ``RescueResult``)."""

    def maintain(self) -> None:
        """The part's own periodic work, run by worker loops with their lease sweep (the
        jobs complete batches whose last finisher died)."""

    def before_batch(self, rows: Sequence[Any]) -> None:
        """Lock mode: called with a claimed batch before its transaction opens (the inbox
        creates the cursors of its keys here, outside the handlers' transaction)."""

    def wake(self) -> None:
        """Tell this part's runners that rows are due (after a rescue or a hand-back)."""
        from django_outbox.engine import triggers

        triggers.dispatch(self.name, self.using, [])


def lease_floor(heartbeat_seconds: float) -> float:
    """The shortest lease the heartbeat can keep renewed (three beats)."""
    return 3 * heartbeat_seconds


_registry: dict[str, type[Part]] = {}


def register(part: type[Part]) -> type[Part]:
    """Make *part* known by name to triggers, rescue and the worker loop."""
    _registry[part.name] = part
    return part


def registered() -> Mapping[str, type[Part]]:
    """Every part known so far, by name."""
    return dict(_registry)
