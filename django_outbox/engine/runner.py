"""The engine's cycle: claim a batch under a lease, do the step, record the outcomes.

``Runner(part)`` drives any :class:`~django_outbox.engine.part.Part` in lease
mode. One cycle claims up to ``BATCH_SIZE`` due rows in one statement and
hands them to the part's ``process``, which declares the start of each
attempt (:meth:`Attempt.start`) and yields outcomes in groups; each group is
recorded at once in a few UPDATEs fenced by the lease token (a runner whose
lease was taken over changes nothing), through the engine's transitions
(``engine.transitions``).

Whatever happens in the step, the batch is given back: rows without an
outcome are released in a ``finally``, and a write that failed (the database
went away) is kept and tried again by :meth:`Runner.settle` before the next
batch. Meanwhile nothing renews those rows' leases (only what a step is
running is renewed), so if the process cannot write them back, the leases run
out and a sweep takes the rows back.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Self, cast

from django.db import DatabaseError, connections, models, transaction
from django.utils import timezone

from django_outbox import conf
from django_outbox.engine import faults, heartbeat, ordering, telemetry, transitions
from django_outbox.engine.lease import (
    IDS,
    ClaimStatement,
    Declared,
    FencedRows,
    IdRuns,
    Lease,
    claim,
    declare,
    declare_pipelined,
    fenced,
    pipelined,
    with_ids,
)
from django_outbox.engine.outcomes import DONE, WAITING, Outcomes
from django_outbox.engine.part import Part
from django_outbox.engine.retry import retry_transient
from django_outbox.engine.transitions import Transition

#: Kept for callers of the old name.
ERROR_CHARS = transitions.ERROR_CHARS

#: Compiled claims (PostgreSQL) per part, database, batch size and whether ids
#: narrow them: a Celery task builds a new runner for every trigger. Settings
#: changes (lease length) drop them.
_STATEMENTS: dict[tuple[type[Part], str, int, bool, Any], ClaimStatement] = {}
conf.on_change(_STATEMENTS.clear)
#: ``Runner._prepared``'s "read the part's claim variant now".
_ASK: Any = object()


@dataclass
class RunResult:
    """Counts of one or more cycles."""

    claimed: int = 0
    done: int = 0
    retried: int = 0
    failed: int = 0
    #: Claimed but not attempted (behind a failed row of its key, out of time, handed
    #: back to other workers, or its lease lost before it started).
    released: int = 0
    #: Outcomes not recorded because the lease had been taken over.
    fenced: int = 0
    batches: int = 0

    def __iadd__(self, other: RunResult) -> Self:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class LeaseAttempt:
    """What a part's step sees of its claimed batch: the deadline, and the declaration
    of each attempt's start."""

    def __init__(self, runner: Runner, lease: Lease, held: heartbeat.Held, rows: Sequence[Any]):
        self.runner = runner
        self.lease = lease
        self.held = held
        #: ``time.monotonic()`` after which the step starts nothing new.
        self.deadline = lease.deadline()
        #: Rows of the batch not recorded yet, by primary key.
        self.pending: dict[Any, Any] = {row.pk: row for row in rows}
        #: Rows whose attempt started and whose outcome is not recorded yet.
        self.open_ids = IdRuns()
        self.starts_are_cheap = lease.worker is not None and pipelined(runner.using)
        self._pipe: Any = None
        """Whether a start is declared without a round trip (PostgreSQL, a worker with a
        heartbeat): then each row is declared alone, exactly as it starts."""

    def start(self, rows: Sequence[Any], *, begin: bool = True) -> list[Any]:
        """Declare that the step starts on *rows* (see ``engine.lease.declare``) and
        return those it may do: rows handed back, or whose lease was taken over, are left
        out and are no longer this batch's. With ``begin=False`` they are declared ahead
        (a window of short jobs) and each is begun with :meth:`begin`. Each returned row
        counts this attempt in its ``attempts``, recorded with its outcome."""
        held = self.held
        ids = [row.pk for row in rows if row.pk in self.pending]
        if begin:
            ids = held.begin(ids)
        else:
            with held.lock:
                ids = [pk for pk in ids if pk in held.unstarted]
        part = self.runner.part
        if not ids:
            return []
        if self.lease.worker is None:
            # No heartbeat: nothing to declare (its rows count as started if it dies).
            declared = Declared(frozenset(ids), timezone.now())
            return self._started(rows, declared)
        for pk in ids:
            self.open_ids.add(pk)
        listed = self.open_ids.text()
        if self.starts_are_cheap:
            declared = self._send_declaration(ids, listed)
        else:
            declared = retry_transient(
                lambda: declare(
                    part.model,
                    ids,
                    self.lease,
                    running_state=self.runner.running,
                    using=part.using,
                    open_ids=listed,
                ),
                what=f"start {part.name} attempts",
                reconnect=part.using,
            )
        chosen = self._started(rows, declared)
        if len(chosen) < len(ids):
            self.open_ids.remove([pk for pk in ids if pk not in declared.ids])
        return chosen

    def _started(self, rows: Sequence[Any], declared: Declared) -> list[Any]:
        """The rows of *rows* that *declared* lets start, their attempt and start time
        noted in hand (recorded with their outcome)."""
        part = self.runner.part
        held = self.held
        field, first = part.attempted_at_field, part.first_started_field
        at = declared.at
        chosen = []
        for row in rows:
            if row.pk not in declared.ids:
                # Handed back (not this batch's any more), or refused: the lease was
                # taken over, and the batch's release at its end changes nothing then.
                if row.pk in held.handed_back:
                    self.pending.pop(row.pk, None)
                continue
            row.attempts += 1
            setattr(row, field, at)
            if first is not None and getattr(row, first, None) is None:
                setattr(row, first, at)
            chosen.append(row)
        return chosen

    def _send_declaration(self, ids: Sequence[Any], listed: str) -> Declared:
        """The declaration on this thread's pipeline (``engine.declarations``): sent, not
        waited for; refused once an earlier answer said the lease was lost."""
        from django_outbox.engine import declarations

        part = self.runner.part
        try:
            self._pipe = self._pipe or declarations.pipeline(part.using)
            return declare_pipelined(
                part.model, ids, self.lease, self.runner.running, part.using, listed, self._pipe
            )
        except Exception:
            self._pipe = None  # the pipeline was dropped: the next start makes another
            raise

    def recorded(self, ids: Sequence[Any]) -> None:
        """The attempts of *ids* have their outcomes recorded: no longer open."""
        if self.open_ids:
            self.open_ids.remove(ids)

    def begin(self, row: Any) -> bool:
        """The step starts on *row* now (declared ahead): False if it was handed back."""
        if self.held.begin_one(row.pk):
            return True
        self.pending.pop(row.pk, None)
        return False

    def idle(self) -> None:
        """The step is between rows (recording, waiting): nothing of it is running."""
        self.held.end_step()

    def hand_over(self) -> bool:
        """The step has handed its started rows over and waits for their outcomes while
        the runner starts another batch, whose declaration will take this batch's place
        on the worker's row (it names one window of starts). So first mark these rows
        themselves as started (``attempt_open``, fenced by the lease; every record and
        rescue clears it): if the worker dies now, the rescue still counts their
        attempt. False if the mark could not be written: then the step is not paused."""
        ids = list(self.open_ids.ids)
        if not ids or self.lease.worker is None:
            # Nothing started, or nothing declared at all (no heartbeat: a rescue counts
            # every row of such a claim as started).
            return True
        part = self.runner.part
        try:
            with_ids(fenced(part.model, self.lease, self.runner.running, part.using), ids).update(
                attempt_open=True
            )
        except DatabaseError:
            self.runner.logger.warning(
                "could not mark %d %s row(s) as started; waiting for their outcomes "
                "before the next batch",
                len(ids),
                part.name,
                exc_info=True,
            )
            return False
        return True


class Runner:
    """Runs a part's batches. Cheap to build; reuse it in loops."""

    result_class: type[RunResult] = RunResult

    #: Whether ``drain()`` claims the next batch on a helper thread while this one runs
    #: (where ``_can_prefetch`` allows). Worker commands turn it off with
    #: ``--no-prefetch``: with several worker processes on few cores shared with the
    #: database, the helper thread's extra concurrency costs more than the overlap saves.
    prefetch = True

    #: How many batches a prefetching drain keeps handed over and waiting for their
    #: answers (a step that says ``WAITING``: RabbitMQ's publisher confirms) while it
    #: runs the next ones; 0 waits for each batch's answers before the next batch.
    #: Each waiting batch's started rows are marked, so a crash counts them started:
    #: up to this many batches more are uncertain after a crash.
    waiting_batches = 2

    def __init__(self, part: Part) -> None:
        self.part = part
        self.logger = part.logger
        #: Writes that failed (outcomes to record, rows to release), tried again by
        #: ``settle()``: fenced, so repeating one late changes nothing it should not.
        self.unsettled: list[Callable[[], Any]] = []
        #: Whether the last ``drain()`` stopped for its budget with rows maybe still due.
        self.cut_short = False
        #: This part's kill points around recording a group (``engine.faults``).
        self._before_record = f"{part.name}.before_record"
        self._after_record = f"{part.name}.after_record"

    @property
    def running(self) -> str:
        """The state a claimed row is in while its lease runs."""
        state = self.part.lifecycle.running
        if state is None:
            raise TypeError(f"{self.part.name} runs in lock mode: drive it with a LockedRunner")
        return state

    @property
    def batch_size(self) -> int:
        return self.part.batch_size

    @property
    def using(self) -> str:
        return self.part.using

    # -- one cycle -------------------------------------------------------------

    def run_batch(self, ids: Sequence[Any] | None = None) -> RunResult:
        """Claim one batch (restricted to primary keys *ids* if given), do it, record it."""
        return self._run(*self.claim_batch(ids))

    def _claimable(self, ids: Sequence[Any] | None, variant: Any = None) -> models.QuerySet[Any]:
        part = self.part
        queryset = part.narrow_claim(part.due(), variant)
        if ids is not None:
            queryset = with_ids(queryset, ids)
        if part.ordering is not None:
            queryset = ordering.heads_only(queryset, part.ordering)
        return queryset

    def _prepared(self, narrowed: bool, variant: Any = _ASK) -> ClaimStatement | None:
        """This runner's compiled claim on PostgreSQL (none with a pinned clock), for the
        part's *variant* (read now unless given)."""
        part = self.part
        if part.clock is not None or connections[self.using].vendor != "postgresql":
            return None
        if variant is _ASK:
            variant = part.claim_variant()
        key = (type(part), self.using, self.batch_size, narrowed, variant)
        statement = _STATEMENTS.get(key)
        if statement is None:
            statement = _STATEMENTS[key] = ClaimStatement.prepare(
                self._claimable(IDS if narrowed else None, variant),
                seconds=part.lease_seconds(),
                limit=self.batch_size,
                running_state=self.running,
                fields=part.claimed_fields,
            )
        return statement

    def claim_batch(self, ids: Sequence[Any] | None = None) -> tuple[list[Any], Lease]:
        """Claim up to ``batch_size`` due rows under a new lease (no attempt counted)."""
        part = self.part
        lease = Lease.new(part.lease_seconds(), heartbeat.current_worker_id())
        variant = part.claim_variant()
        statement = self._prepared(ids is not None, variant)

        def take() -> list[Any]:
            if statement is not None:
                return statement.run(lease, ids)
            return claim(
                self._claimable(ids, variant),
                lease=lease,
                limit=self.batch_size,
                running_state=self.running,
                fields=part.claimed_fields,
                now=part.now(),
            )

        # One statement (or one transaction): a deadlock victim's claim was
        # rolled back whole, so running it again under the same lease is safe.
        rows = retry_transient(take, what=f"{part.name} claim", reconnect=self.using)
        room = self.batch_size - len(rows)
        if part.ordering is not None and room > 0 and rows:
            # Followers are an optimisation: if claiming them fails, the heads
            # go out alone and the followers come in a later batch.
            try:
                rows += ordering.claim_followers(self, rows, lease, room)
            except DatabaseError:
                self.logger.warning("claiming followers failed; running the heads alone")
        return rows, lease

    def _run(self, rows: list[Any], lease: Lease, held: heartbeat.Held | None = None) -> RunResult:
        return _finish(self._stages(rows, lease, held, overlap=False))

    def _stages(
        self,
        rows: list[Any],
        lease: Lease,
        held: heartbeat.Held | None = None,
        *,
        overlap: bool,
    ) -> Generator[None, None, RunResult]:
        """Run the step over *rows* and record its outcomes; the result is the
        generator's return value. With *overlap*, it pauses (yields) once, where the
        step first says ``WAITING`` and its started rows are marked so a crash counts
        them (``LeaseAttempt.hand_over``): the caller runs the next batch meanwhile."""
        result = self.result_class(claimed=len(rows), batches=1 if rows else 0)
        if not rows:
            return result
        if held is None:
            held = heartbeat.hold(self.part, lease, [row.pk for row in rows])
        attempt = LeaseAttempt(self, lease, held, rows)
        steps = self.part.process(rows, attempt)
        try:
            for outcomes in steps:
                if outcomes is WAITING:
                    if overlap and attempt.hand_over():
                        overlap = False  # once a batch
                        yield
                    continue
                attempt.idle()
                group = [attempt.pending.pop(pk) for pk in list(outcomes) if pk in attempt.pending]
                if group:
                    faults.point(self._before_record)
                    result += self._record_or_keep(group, outcomes, lease)
                    attempt.recorded([row.pk for row in group])
                    faults.point(self._after_record)
        finally:
            close = getattr(steps, "close", None)
            if close is not None:
                close()
            heartbeat.let_go(held)
            # Rows the step never reached (or reached and gave no outcome) go back now.
            leftover = [row for pk, row in attempt.pending.items() if pk not in held.handed_back]
            result.released += len(held.handed_back) + len(leftover)
            if leftover:
                result.fenced += len(leftover) - self.release_or_keep(leftover, lease)
        return result

    def _record_or_keep(self, rows: list[Any], outcomes: Outcomes, lease: Lease) -> RunResult:
        try:
            return self.record(rows, outcomes, lease)
        except DatabaseError:
            self.unsettled.append(lambda: self.record(rows, outcomes, lease))
            raise

    def release_or_keep(self, rows: list[Any], lease: Lease) -> int:
        """Give *rows* back now, or, if the database fails, before the next batch."""
        try:
            return self.release(rows, lease)
        except DatabaseError:
            self.logger.warning(
                "could not give back %d %s row(s); trying again before the next batch "
                "(or their lease runs out and a sweep takes them)",
                len(rows),
                self.part.name,
            )
            self.unsettled.append(lambda: self.release(rows, lease))
            return len(rows)

    def settle(self) -> int:
        """Write what a failed batch left unwritten (its outcomes, its releases): fenced,
        so a write whose lease meanwhile ran out changes nothing. Raises the database's
        error if it is still away. Returns how many writes were settled."""
        settled = 0
        while self.unsettled:
            self.unsettled[0]()
            self.unsettled.pop(0)
            settled += 1
        return settled

    # -- recording -------------------------------------------------------------

    def record(self, rows: Sequence[Any], outcomes: Outcomes, lease: Lease) -> RunResult:
        """Record the outcomes of *rows* (all present in *outcomes*), fenced by *lease*."""
        part = self.part
        started = _one_start(part, rows)
        decisions = transitions.Decisions(part, part.record_time(started), count_attempt=True)
        if all(outcomes[row.pk] is DONE for row in rows) and not part.has_own_done_values:
            # The hot path: every row of the group finished, alike (one UPDATE).
            shared = decisions.decide(rows[0], DONE).values
            done = transitions.Transition.MARK_DONE
            changes = [transitions.Change(row, done, shared, shared=shared) for row in rows]
        else:
            changes = [decisions.decide(row, outcomes[row.pk]) for row in rows]
        held = FencedRows.of(part.model, lease, self.running, self.using)

        def write() -> transitions.Applied:
            # Each UPDATE is fenced and stands alone; parking or freeing a key goes with
            # the row's change, in one transaction.
            alone = not any(
                c.values.get("blocking") or getattr(c.row, "blocking", False) for c in changes
            )
            with nullcontext() if alone else transaction.atomic(using=self.using):
                return transitions.apply(part, held, changes)

        # Every write is fenced by the lease token and a failed transaction is
        # rolled back whole, so repeating it records each outcome once.
        applied = retry_transient(write, what=f"record {part.name} outcomes", reconnect=self.using)
        written = changes
        if applied.fenced:
            written = self._still_ours(changes, lease)
            self.logger.warning(
                "%d outcome(s) not recorded: the lease expired and was taken over",
                len(changes) - len(written),
            )
        return self._report(written, len(changes) - len(written))

    def _still_ours(
        self, changes: list[transitions.Change], lease: Lease
    ) -> list[transitions.Change]:
        """The changes of a partly fenced group that were written: rows now in the state
        their change set (done rows also still carry this lease's token)."""
        part = self.part
        rows = part.model._default_manager.using(self.using).filter(
            pk__in=[c.row.pk for c in changes]
        )
        now_in = dict(rows.values_list("pk", "state"))
        tokens = dict(rows.values_list("pk", "lock_token"))
        kept = []
        for change in changes:
            if now_in.get(change.row.pk) != change.values.get("state"):
                continue
            if change.transition is Transition.MARK_DONE and tokens.get(change.row.pk) != (
                lease.token
            ):
                continue
            kept.append(change)
        return kept

    def _report(self, changes: Sequence[transitions.Change], fenced_out: int) -> RunResult:
        """Counts of recorded *changes*, and the part's hooks (signals, logs)."""
        part = self.part
        if part.hooks_see_recorded_values:
            transitions.bring_up_to_date(changes)
        result = self.result_class(fenced=fenced_out)
        telemetry.recorded(part, changes)
        # One pass: the done rows, and the failed changes (few) counted afterwards.
        mark_done = Transition.MARK_DONE
        done = []
        failed = []
        for change in changes:
            if change.transition is mark_done:
                done.append(change.row)
            elif change.failed:
                failed.append(change)
        result.done = len(done)
        result.retried = sum(1 for c in failed if c.will_retry)
        result.failed = len(failed) - result.retried
        if done:
            part.on_done(done)
        for change in failed:
            part.on_failed(change.row, change.error, change.will_retry)
        return result

    def release(self, rows: Sequence[Any], lease: Lease) -> int:
        """Give claimed *rows* back at once (an attempt declared but not run uncounted)."""
        part = self.part
        held = fenced(part.model, lease, self.running, self.using)
        return retry_transient(
            lambda: with_ids(held, [row.pk for row in rows]).update(
                **transitions.release_values(part)
            ),
            what=f"release {part.name} rows",
            reconnect=self.using,
        )

    # -- loops -----------------------------------------------------------------

    def drain(
        self, *, time_budget: float | None = None, max_batches: int | None = None
    ) -> RunResult:
        """Run batches until nothing is due, the budget (seconds) or *max_batches* is spent.
        ``cut_short`` tells afterwards whether it stopped for the budget or the count
        with rows possibly still due (a Celery task then sends its trigger again).

        With SKIP LOCKED (PostgreSQL, MariaDB), outside a transaction, the next
        batch is claimed by a helper thread while this one is processed and
        recorded: database and broker waits overlap.
        """
        budget = self.part.config.drain_seconds if time_budget is None else time_budget
        deadline = time.monotonic() + budget
        self.cut_short = False
        self.settle()
        # The first batch runs here: an idle poll (nothing or little due) costs
        # one claim, no helper thread and no second database connection.
        total = self.run_batch()
        last = total
        if self._more(total) and self._can_prefetch():
            room = max_batches is None or total.batches < max_batches
            if room and time.monotonic() < deadline:
                left = None if max_batches is None else max_batches - total.batches
                total += self._drain_prefetching(deadline, left)
        else:
            while self._more(last) and time.monotonic() < deadline:
                if max_batches is not None and total.batches >= max_batches:
                    break
                if self.part.stopping.is_set():
                    break
                last = self.run_batch()
                total += last
        out_of_time = time.monotonic() >= deadline
        out_of_batches = max_batches is not None and total.batches >= max_batches
        self.cut_short = (out_of_time or out_of_batches) and total.claimed > 0
        return total

    def _more(self, result: RunResult) -> bool:
        """Whether a drain goes on after *result*: a full batch means more may be due."""
        return result.claimed >= self.batch_size

    def _can_prefetch(self) -> bool:
        if not self.prefetch:
            return False
        connection = connections[self.using]
        # Another thread's connection cannot see rows of a transaction this
        # one holds open (a test case, a caller's atomic block); without
        # SKIP LOCKED (SQLite: a single writer) a second connection would only
        # queue behind the first.
        return (
            connection.features.has_select_for_update_skip_locked and not connection.in_atomic_block
        )

    def _drain_prefetching(self, deadline: float, max_batches: int | None) -> RunResult:
        Claimed = tuple[list[Any], Lease, heartbeat.Held]
        batches: queue.Queue[Claimed | BaseException | object | None] = queue.Queue(maxsize=1)
        stop = threading.Event()
        settled = threading.Condition()
        in_flight = 0  # batches claimed and not yet recorded
        handed = 0  # of those, batches handed over and waiting for their answers
        limit = self.waiting_batches

        def ready(settling: bool) -> bool:
            """Whether the claimer may claim (read under *settled*, on each wake-up)."""
            return in_flight == 0 if settling else in_flight - handed <= 1

        def claimer() -> None:
            nonlocal in_flight
            try:
                claimed = 0
                wait_for_settle = False
                while not stop.is_set() and (max_batches is None or claimed < max_batches):
                    with settled:
                        # Prefetch one batch, no more: besides the batches waiting for
                        # their answers, claim only while at most one is in flight (the
                        # one running). A batch waits at most one step for its turn,
                        # well inside its lease (and the heartbeat hands a waiting
                        # batch back if that step runs long). After a short claim,
                        # wait until nothing is in flight (rows of a key may be waiting
                        # behind it), then claim again.
                        settled.wait_for(lambda: ready(wait_for_settle) or stop.is_set())  # noqa: B023
                        idle = in_flight == 0
                    if stop.is_set() or self.part.stopping.is_set():
                        break
                    rows, lease = self.claim_batch()
                    if rows:
                        claimed += 1
                        with settled:
                            in_flight += 1
                        held = heartbeat.hold(self.part, lease, [row.pk for row in rows])
                        batches.put((rows, lease, held))
                    short = len(rows) < self.batch_size
                    if (short and idle) or time.monotonic() >= deadline:
                        break  # as the sequential drain: a short batch with nothing ahead
                    wait_for_settle = short
                    if short:
                        batches.put(_SETTLE)
            except BaseException as exc:  # re-raised in the processing thread
                batches.put(exc)
            finally:
                batches.put(None)
                connections[self.using].close()

        thread = threading.Thread(target=claimer, name="django-outbox-claimer", daemon=True)
        thread.start()
        total = self.result_class()
        # Batches whose step waits for answers (WAITING), oldest first: each is resumed
        # and recorded once more than *limit* wait, so outcomes are recorded in the
        # order the batches were handed over, up to *limit* batches late.
        waiting: deque[Generator[None, None, RunResult]] = deque()

        def settle_one(was_handed: bool = False) -> None:
            nonlocal in_flight, handed
            with settled:
                in_flight -= 1
                handed -= was_handed
                settled.notify_all()

        def record_waiting(keep: int = 0) -> None:
            """Resume the oldest waiting batches to their end until *keep* are left."""
            nonlocal total
            while len(waiting) > keep:
                try:
                    total += _finish(waiting[0])
                finally:
                    waiting.popleft()
                    settle_one(was_handed=True)

        try:
            while (item := batches.get()) is not None:
                if item is _SETTLE:
                    # The claimer waits until nothing is in flight: waiting batches
                    # are recorded now, not after next batches that will not come.
                    record_waiting()
                    continue
                if isinstance(item, BaseException):
                    raise item
                rows, lease, held = cast(Claimed, item)
                stages = self._stages(rows, lease, held, overlap=limit > 0)
                paused = _advance(stages)
                if paused is None:
                    # This batch waits from now on (if recording an earlier one fails,
                    # the cleanup below still records this one: it was handed over).
                    waiting.append(stages)
                    with settled:
                        handed += 1  # the claimer may take the next batch now
                        settled.notify_all()
                    record_waiting(keep=limit)
                else:
                    record_waiting()
                    total += paused
                    settle_one()
            record_waiting()
        finally:
            # The drain failed with batches handed over and waiting for their answers:
            # record what came back, not give them back unattempted (each on its own:
            # one failing to record leaves the others to try).
            while waiting:
                try:
                    record_waiting(keep=len(waiting) - 1)
                except Exception:
                    self.logger.warning(
                        "recording a %s batch that waited for its answers failed",
                        self.part.name,
                        exc_info=True,
                    )
            stop.set()
            with settled:
                settled.notify_all()
            # Rows the claimer took but we never processed go back at once.
            while thread.is_alive() or not batches.empty():
                try:
                    item = batches.get(timeout=0.1)
                except queue.Empty:
                    continue
                if isinstance(item, tuple):
                    rows, lease, held = item
                    heartbeat.let_go(held)
                    unstarted = [row for row in rows if row.pk not in held.handed_back]
                    self.release_or_keep(unstarted, lease)
            thread.join()
        return total

    def deliver(self, ids: Iterable[Any]) -> RunResult:
        """Run the rows *ids* (an on-commit trigger), then drain what else is due.

        If another runner already took all of *ids*, return at once: under
        load many triggers collapse into the few runners that are draining.
        An empty *ids* (a wake-up after a rescue) just drains.
        """
        wanted = sorted(set(ids))
        if not wanted:
            return self.drain()
        total = self.result_class()
        for start in range(0, len(wanted), self.batch_size):
            total += self.run_batch(wanted[start : start + self.batch_size])
        if total.claimed == 0:
            return total
        total += self.drain()
        return total


#: Put by the claimer of a prefetching drain when it waits until no batch is in flight.
_SETTLE = object()


def _advance(stages: Generator[None, None, RunResult]) -> RunResult | None:
    """Run *stages* (``Runner._stages``) to its pause (``None``) or its end (its result)."""
    try:
        next(stages)
    except StopIteration as end:
        result: RunResult = end.value
        return result
    return None


def _finish(stages: Generator[None, None, RunResult]) -> RunResult:
    """Run *stages* to its end: its result."""
    while True:
        result = _advance(stages)
        if result is not None:
            return result


def _one_start(part: Part, rows: Sequence[Any]) -> datetime | None:
    """Give the rows of a group one start time, the earliest of theirs: each window of a
    group declared its own, and rows that finished alike then share one UPDATE. A row's
    recorded start is at most the group's span (a fraction of a second) early."""
    field, first_field = part.attempted_at_field, part.first_started_field
    starts = [getattr(row, field) for row in rows if getattr(row, field, None) is not None]
    if not starts:
        return None
    earliest: datetime = min(starts)
    for row in rows:
        started = getattr(row, field, None)
        if started is None:
            continue
        if first_field is not None and getattr(row, first_field, None) == started:
            setattr(row, first_field, earliest)  # its first attempt is this one
        setattr(row, field, earliest)
    return earliest
