"""Lock mode: the step runs inside one transaction with its rows' new state.

Some steps must commit together with their row's new state: an inbox
handler's database effects and the ``handled`` mark are one commit, or a
crash between them would handle a message twice. Such a part (its
``Lifecycle.running`` is ``None``) runs a batch in two steps:

1. **claim and count**, committed: up to ``BATCH_SIZE`` due rows are locked
   with ``SELECT … FOR UPDATE SKIP LOCKED``, given a lease (other claimers
   pass over them) and their attempt is counted (``attempts + 1``,
   ``attempt_open``). The count is durable before anything runs: a row whose
   handler kills its process (out of memory, a segfault, ``os._exit``) uses up
   its attempts like any failure;
2. **handle**, one transaction: the rows are locked again (by the lease's
   token), the part's ``process`` does each row (normally in a savepoint of
   its own) and yields outcomes, which are written (the engine's
   transitions: retry, dead-letter, skip, defer) before everything commits.

A worker that dies in step 2 loses its connection: the database rolls the
transaction back, effects included. The rows keep their counted attempt and
``attempt_open``; they are due again when their lease runs out (at once when
the heartbeats find the worker dead). A row claimed with ``attempt_open`` (or
``unclean_end``) set ended its last attempt uncleanly: it is claimed and
handled alone, in a transaction of its own, so a row that kills its worker
cannot take another batch down with it (only the batch it first killed was
charged an attempt with it), and once its attempts are used up it is
dead-lettered with the reason instead of being handled again.

The price: one more committed statement per batch, and a batch holds its
transaction for as long as its handlers run, so keep handlers short (long
work belongs in a job).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import F

from django_outbox.engine import clock, faults, heartbeat, telemetry, transitions
from django_outbox.engine.lease import Lease, with_ids
from django_outbox.engine.outcomes import Fail, Outcomes
from django_outbox.engine.part import Part
from django_outbox.engine.retry import retry_transient
from django_outbox.engine.runner import Runner, RunResult
from django_outbox.engine.transitions import Change, Transition


@dataclass
class LockedResult(RunResult):
    """Counts of lock-mode cycles."""

    skipped: int = 0
    #: Rows that asked to wait (``Defer``): not an attempt.
    deferred: int = 0


class LockedAttempt:
    """What a lock-mode step sees: its deadline. The batch's attempts were counted when
    it was claimed, so ``start`` only hands the rows back."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def start(self, rows: Sequence[Any], *, begin: bool = True) -> list[Any]:
        return list(rows)

    def begin(self, row: Any) -> bool:
        return True

    def idle(self) -> None:
        pass

    @property
    def starts_are_cheap(self) -> bool:
        return True  # counted by the claim: starting costs nothing more


@dataclass
class Claimed:
    """A lock-mode claim: the rows to handle, and which of them ended their last attempt
    uncleanly (each is handled alone)."""

    rows: list[Any]
    lease: Lease
    suspects: set[Any]
    #: Rows dead-lettered at claim time: their worker died in every attempt they had.
    worn_out: list[Change]
    #: Due rows were left unclaimed (a suspect is claimed alone): a drain goes on.
    cut: bool = False


class LockedRunner(Runner):
    """Runs a lock-mode part's batches: a committed claim, then one transaction."""

    result_class: type[LockedResult] = LockedResult

    def __init__(self, part: Part) -> None:
        if part.lifecycle.running is not None:
            raise TypeError(f"{part.name} runs under leases: drive it with a Runner")
        super().__init__(part)
        #: The last claim left due rows behind (see ``Claimed.cut``).
        self._cut = False
        self._before_commit = f"{part.name}.before_commit"

    # -- claim ---------------------------------------------------------------------

    def run_batch(self, ids: Sequence[Any] | None = None) -> RunResult:
        claimed = retry_transient(
            lambda: self._claim(ids), what=f"{self.part.name} claim", reconnect=self.using
        )
        self._cut = claimed.cut
        result = self.result_class(claimed=len(claimed.rows), batches=1 if claimed.rows else 0)
        if claimed.worn_out:
            result += self._report(claimed.worn_out, 0)
            result.claimed += len(claimed.worn_out)
        if not claimed.rows:
            return result
        result += self._handle(claimed)
        return result

    def _claim(self, ids: Sequence[Any] | None) -> Claimed:
        """Step 1: lock due rows, dead-letter those whose worker died in each of their
        attempts, lease and count the rest; commit."""
        part = self.part
        lease = Lease.new(part.config.lease_seconds, heartbeat.current_worker_id())
        model = part.model._default_manager.using(self.using)
        with transaction.atomic(using=self.using):
            rows = list(self._claimable(ids).select_for_update(skip_locked=True)[: self.batch_size])
            if not rows:
                return Claimed([], lease, set(), [])
            now = part.now()
            suspects = {row.pk for row in rows if row.attempt_open or row.unclean_end}
            worn: list[Change] = []
            for row in rows:
                if row.pk in suspects and row.attempts >= part.max_attempts(row):
                    reason = (
                        f"its worker stopped during its last attempt (killed, out of memory, "
                        f"crashed), and its {row.attempts} attempt(s) are used up: not "
                        "handled again"
                    )
                    worn.append(transitions.decide(part, row, Fail(reason), now))
            if worn:
                transitions.apply(part, model.filter(state=part.lifecycle.ready), worn)
            gone = {change.row.pk for change in worn}
            rows = [row for row in rows if row.pk not in gone]
            # A row whose last attempt killed its worker is handled alone, and nothing
            # else is claimed with it: the others would be charged if it kills again.
            alone = next((row for row in rows if row.pk in suspects), None)
            cut = alone is not None and len(rows) > 1
            if alone is not None:
                rows = [alone]
            if rows:
                with_ids(model, [row.pk for row in rows]).update(
                    locked_until=clock.later(now, part.config.lease_seconds),
                    lock_token=lease.token,
                    claimed_by=lease.worker,
                    attempt_open=True,
                    **{part.attempted_at_field: now},
                    attempts=F("attempts") + 1,
                )
        for row in rows:
            row.attempts += 1
            row.attempt_open = True
            row.lock_token = lease.token
            row.claimed_by = lease.worker
        return Claimed(rows, lease, {row.pk for row in rows} & suspects, worn, cut)

    # -- handle --------------------------------------------------------------------

    def _handle(self, claimed: Claimed) -> LockedResult:
        """Step 2: each suspect alone, then the rest together, each in one transaction;
        rows a failed group never reached are given back uncounted."""
        part = self.part
        part.before_batch(claimed.rows)
        groups = [[row] for row in claimed.rows if row.pk in claimed.suspects]
        rest = [row for row in claimed.rows if row.pk not in claimed.suspects]
        if rest:
            groups.append(rest)
        total = self.result_class()
        for index, group in enumerate(groups):
            try:
                # A deadlock victim's or a lost connection's group was rolled back
                # whole, handlers' effects included: running it again is safe.
                total += retry_transient(
                    lambda: self._run_locked(group, claimed.lease),  # noqa: B023
                    what=f"{part.name} batch",
                    reconnect=self.using,
                )
            except DatabaseError:
                # The group's attempt counts and it runs alone next time; the groups
                # not reached go back uncounted.
                self._give_back(group, claimed.lease, unclean=True)
                for later in groups[index + 1 :]:
                    self._give_back(later, claimed.lease, unclean=False)
                raise
        return total

    def _run_locked(self, rows: list[Any], lease: Lease) -> LockedResult:
        part = self.part
        ours = part.model._default_manager.using(self.using).filter(
            state=part.lifecycle.ready, lock_token=lease.token
        )
        every = part.model._default_manager.using(self.using)
        with transaction.atomic(using=self.using):
            # Locked by primary key alone, then checked: a lock taken through another
            # index (InnoDB locks that index's entry first) would wait for a row while
            # holding an entry that the row's holder needs next (a deadlock).
            found = (
                with_ids(every, [row.pk for row in rows])
                .select_for_update()
                .order_by("pk")
                .values_list("pk", "state", "lock_token")
            )
            ready, token = part.lifecycle.ready, lease.token
            locked = {pk for pk, state, held in found if state == ready and held == token}
            mine = [row for row in rows if row.pk in locked]
            result, changes = self._process(mine, ours)
        # Hooks run once the outcomes (and the steps' effects) are committed.
        self._after_commit(changes)
        return result

    def run_owned(self, rows: Sequence[Any]) -> RunResult:
        """Process *rows* that the caller's open transaction owns already (it inserted
        them, so no other transaction sees them yet): no claim, the outcomes are
        written in that transaction, the hooks run when it commits.

        ``inbox_consume`` stores a batch and handles it in one commit this way. If
        the transaction rolls back, the rows and their handling go with it.
        """
        connection = transaction.get_connection(self.using)
        if not connection.in_atomic_block:
            raise transaction.TransactionManagementError(
                "run_owned() needs the transaction that created the rows"
            )
        self.part.before_batch(rows)
        for row in rows:
            row.attempts += 1  # this attempt, written with its outcome
        owned = self.part.model._default_manager.using(self.using).filter(
            state=self.part.lifecycle.ready, lock_token__isnull=True
        )
        result, changes = self._process(list(rows), owned, count_attempts=True)
        transaction.on_commit(lambda: self._after_commit(changes), using=self.using)
        return result

    def _process(
        self, rows: list[Any], held: Any, *, count_attempts: bool = False
    ) -> tuple[LockedResult, list[Change]]:
        """Run the part's step on *rows* and write the outcomes (inside a transaction)."""
        part = self.part
        result = self.result_class()
        if not rows:
            return result, []
        attempt = LockedAttempt(time.monotonic() + part.config.lease_seconds * 0.8)
        outcomes: Outcomes = {}
        for group in part.process(rows, attempt):
            outcomes.update(group)
        decisions = transitions.Decisions(part, part.now(), write_attempts=count_attempts)
        changes = []
        for row in rows:
            outcome = outcomes.get(row.pk)
            if outcome is None:
                change = transitions.release(part, row)
                change.values["attempts"] = max(row.attempts - 1, 0)
            else:
                change = decisions.decide(row, outcome)
            if count_attempts and "attempts" not in change.values:
                change.values = {**change.values, "attempts": row.attempts}
            changes.append(change)
        transitions.apply(part, held, changes)
        # The steps' effects and the outcomes are written; the commit is the caller's.
        faults.point(self._before_commit)
        for change in changes:
            transition = change.transition
            if transition is Transition.MARK_DONE:
                result.done += 1
            elif transition is Transition.SKIP:
                result.skipped += 1
            elif transition is Transition.DEFER:
                result.deferred += 1
            elif transition is Transition.RELEASE:
                result.released += 1
            elif change.will_retry:
                result.retried += 1
            else:
                result.failed += 1
        return result, changes

    def _after_commit(self, changes: Sequence[Change]) -> None:
        telemetry.recorded(self.part, changes)
        self.part.on_recorded(changes)
        done = transitions.rows_of(changes, Transition.MARK_DONE)
        if done:
            self.part.on_done(done)
        for change in changes:
            if change.failed:
                self.part.on_failed(change.row, change.error, change.will_retry)

    def _give_back(self, rows: Sequence[Any], lease: Lease, *, unclean: bool) -> None:
        """Clear the claim of *rows* after their group failed: due again at once. Their
        attempt stays counted and they run alone next time (*unclean*), or, never
        reached, their attempt is uncounted."""
        part = self.part
        ours = part.model._default_manager.using(self.using).filter(
            state=part.lifecycle.ready, lock_token=lease.token
        )
        values: dict[str, Any] = dict(transitions.LEASE_CLEARED)
        if unclean:
            values.update(attempt_open=False, unclean_end=True)
        else:
            values.update(attempt_open=False, attempts=F("attempts") - 1)

        def write() -> int:
            return int(with_ids(ours, [row.pk for row in rows]).update(**values))

        try:
            retry_transient(write, what=f"give back {part.name} rows", reconnect=self.using)
        except DatabaseError:
            self.unsettled.append(write)

    def release(self, rows: Sequence[Any], lease: Any = None) -> int:
        """Lock mode gives rows back inside its transaction (see ``_process``)."""
        return 0

    def _more(self, result: RunResult) -> bool:
        # A batch cut short to handle a suspect alone left due rows behind; a full batch
        # of rows that all chose to wait says nothing more is ready.
        if self._cut:
            return True
        deferred = getattr(result, "deferred", 0)
        return result.claimed >= self.batch_size and result.claimed > deferred

    def _can_prefetch(self) -> bool:
        return False  # a prefetched batch would hold its claim while it waits
