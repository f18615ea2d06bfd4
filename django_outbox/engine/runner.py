"""The engine's cycle: claim a batch under a lease, do the step, record the outcomes.

``Runner(part)`` drives any :class:`~django_outbox.engine.part.Part`. One
cycle claims up to ``BATCH_SIZE`` due rows in one statement, hands them to
the part's ``process`` and records each group of outcomes as it comes back,
in a few UPDATEs fenced by the lease token: a runner whose lease was taken
over changes nothing. Retryable failures back off with jitter, exhausted or
permanent ones are dead-lettered, unattempted rows go back uncounted.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, fields
from typing import Any

from django.db import DatabaseError, connections, models, transaction
from django.db.models import F

from django_outbox import conf
from django_outbox.engine import clock, heartbeat, ordering
from django_outbox.engine.backoff import backoff_delay
from django_outbox.engine.lease import (
    IDS,
    ClaimStatement,
    Lease,
    claim,
    fenced,
    update_each,
    with_ids,
)
from django_outbox.engine.part import Outcomes, Part
from django_outbox.engine.retry import retry_transient
from django_outbox.exceptions import DeliveryError, RetryableError, UncertainError

ERROR_CHARS = 4000

#: Compiled claims (PostgreSQL) per part, database, batch size and whether ids
#: narrow them: a Celery task builds a new runner for every trigger. Settings
#: changes (lease length) drop them.
_STATEMENTS: dict[tuple[type[Part], str, int, bool, Any], ClaimStatement] = {}
conf.on_change(_STATEMENTS.clear)


@dataclass
class RunResult:
    """Counts of one or more cycles."""

    claimed: int = 0
    done: int = 0
    retried: int = 0
    failed: int = 0
    #: Claimed but not attempted (behind a failed row of its key, or out of time).
    released: int = 0
    #: Outcomes not recorded because the lease had been taken over.
    fenced: int = 0
    batches: int = 0

    def __iadd__(self, other: RunResult) -> RunResult:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class Runner:
    """Runs a part's batches. Cheap to build; reuse it in loops."""

    result_class: type[RunResult] = RunResult

    def __init__(self, part: Part) -> None:
        self.part = part
        self.logger = part.logger

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

    def _claimable(self, ids: Sequence[Any] | None) -> models.QuerySet[Any]:
        part = self.part
        queryset = part.due()
        if ids is not None:
            queryset = with_ids(queryset, ids)
        if part.ordering is not None:
            queryset = ordering.heads_only(queryset, part.ordering)
        return queryset

    def _prepared(self, narrowed: bool) -> ClaimStatement | None:
        """This runner's compiled claim on PostgreSQL (none with a pinned clock)."""
        part = self.part
        if part.clock is not None or connections[self.using].vendor != "postgresql":
            return None
        key = (type(part), self.using, self.batch_size, narrowed, part.claim_variant())
        statement = _STATEMENTS.get(key)
        if statement is None:
            statement = _STATEMENTS[key] = ClaimStatement.prepare(
                self._claimable(IDS if narrowed else None),
                seconds=part.lease_seconds(),
                limit=self.batch_size,
                running_state=self.running,
                fields=part.claimed_fields,
            )
        return statement

    def claim_batch(self, ids: Sequence[Any] | None = None) -> tuple[list[Any], Lease]:
        """Claim up to ``batch_size`` due rows under a new lease."""
        part = self.part
        lease = Lease.new(part.lease_seconds(), heartbeat.current_worker_id())
        statement = self._prepared(ids is not None)

        def take() -> list[Any]:
            if statement is not None:
                return statement.run(lease, ids)
            return claim(
                self._claimable(ids),
                lease=lease,
                limit=self.batch_size,
                running_state=self.running,
                fields=part.claimed_fields,
                now=part.now(),
            )

        # One statement (or one transaction): a deadlock victim's claim was
        # rolled back whole, so running it again under the same lease is safe.
        rows = retry_transient(take, what=f"{part.name} claim")
        room = self.batch_size - len(rows)
        if part.ordering is not None and room > 0 and rows:
            # Followers are an optimisation: if claiming them fails, the heads
            # go out alone and the followers come in a later batch.
            try:
                rows += ordering.claim_followers(self, rows, lease, room)
            except DatabaseError:
                self.logger.warning("claiming followers failed; running the heads alone")
        return rows, lease

    def _run(self, rows: list[Any], lease: Lease) -> RunResult:
        result = self.result_class(claimed=len(rows), batches=1 if rows else 0)
        if not rows:
            return result
        pending = {row.pk: row for row in rows}
        for outcomes in self.part.process(rows, lease.deadline()):
            batch = [pending.pop(pk) for pk in list(outcomes) if pk in pending]
            if batch:
                result += self.record(batch, outcomes, lease)
        if pending:
            released = self.release(list(pending.values()), lease)
            result.released += len(pending)
            result.fenced += len(pending) - released
        return result

    # -- recording -------------------------------------------------------------

    def record(self, rows: Sequence[Any], outcomes: Outcomes, lease: Lease) -> RunResult:
        """Record the outcomes of *rows* (all present in *outcomes*), fenced by *lease*."""
        part = self.part
        life = part.lifecycle
        now = part.now()
        result = self.result_class()
        held = fenced(part.model, lease, self.running, self.using)
        done = [row for row in rows if outcomes[row.pk] is None]
        keyed = part.ordering.key_fields if part.ordering is not None else ()
        changes: dict[Any, dict[str, Any]] = {}
        failed: list[tuple[Any, str, bool]] = []
        for row in rows:
            error = outcomes[row.pk]
            if error is None:
                continue
            if not isinstance(error, DeliveryError):
                raise TypeError(f"a lease-mode part returned {error!r}: only errors or None")
            change, text, retry = self._failure(row, error, now)
            changes[row.pk] = {
                **change,
                "last_error": text,
                "locked_until": None,
                "lock_token": None,
                "claimed_by": None,
                **part.failed_values(row, error),
                **({} if retry else part.dead_values(row, now)),
            }
            if keyed and getattr(row, keyed[-1]) is not None:
                changes[row.pk]["blocking"] = True
            failed.append((row, text, retry))
            if retry:
                result.retried += 1
            else:
                result.failed += 1
        done_values = {"state": life.done, **part.done_values(now), "locked_until": None}
        # Keys whose failed head now finished release their parked rows; keys
        # whose head failed park theirs. Rare, and in the same transaction.
        releasing = [row for row in done if getattr(row, "blocking", False)]
        parking = [row for row in rows if changes.get(row.pk, {}).get("blocking")]
        if keyed:
            done_values.update(blocking=False, blocked=False)

        # Parts that record something of each row's own (a job's return value).
        per_row = {row.pk: part.done_row_values(row, now) for row in done}
        if not any(per_row.values()):
            per_row = {}

        def write() -> tuple[int, int]:
            many = (bool(done) and bool(changes)) or bool(releasing) or bool(parking)
            with transaction.atomic(using=self.using) if many else nullcontext():
                # By id as well as by token: rows under this lease that are not
                # in this group were not done. Finished rows keep their token
                # and worker: who finished them, and a way to tell ours apart.
                recorded_done = (
                    with_ids(held, [row.pk for row in done]).update(**done_values)
                    if done and not per_row
                    else update_each(held, {pk: {**done_values, **v} for pk, v in per_row.items()})
                )
                recorded = recorded_done + update_each(held, changes)
                if releasing:
                    ordering.unblock(part, releasing)
                if parking:
                    ordering.block(part, parking)
                return recorded_done, recorded

        # Every write is fenced by the lease token and a failed transaction is
        # rolled back whole, so repeating it records each outcome once.
        recorded_done, recorded = retry_transient(
            write, what=f"record {part.name} outcomes", reconnect=self.using
        )
        if recorded_done < len(done):
            # Some leases were taken over: report only what this runner recorded.
            mine = set(
                part.model._default_manager.using(self.using)
                .filter(pk__in=[row.pk for row in done], state=life.done, lock_token=lease.token)
                .values_list("pk", flat=True)
            )
            done = [row for row in done if row.pk in mine]
        result.done = len(done)
        result.fenced = len(rows) - recorded
        if result.fenced:
            self.logger.warning(
                "%d outcome(s) not recorded: the lease expired and was taken over", result.fenced
            )
        if done:
            part.on_done(done)
        for row, text, retry in failed:
            part.on_failed(row, text, retry)
        return result

    def _failure(
        self, row: Any, error: DeliveryError, now: clock.Instant
    ) -> tuple[dict[str, Any], str, bool]:
        """The change for a failed attempt: retry with backoff, park, or dead-letter."""
        part = self.part
        life = part.lifecycle
        text = (str(error) or type(error).__name__)[:ERROR_CHARS]
        if isinstance(error, UncertainError) and part.holds_uncertain(row):
            text = f"outcome uncertain, held for an operator: {text}"
            return {"state": life.failed, **part.held_values()}, text, False
        retryable = isinstance(error, RetryableError)
        if retryable and row.attempts < part.max_attempts(row):
            base, maximum = part.retry_delays(row)
            delay = backoff_delay(row.attempts, base=base, maximum=maximum, rng=part.rng)
            change = {"state": life.ready, "available_at": clock.later(now, delay)}
            return change, text, True
        if retryable:
            attempts = "1 attempt" if row.attempts == 1 else f"{row.attempts} attempts"
            text = f"gave up after {attempts}: {text}"
        return {"state": life.failed}, text, False

    def release(self, rows: Sequence[Any], lease: Lease) -> int:
        """Give claimed, unattempted *rows* back at once (their attempt uncounted)."""
        life = self.part.lifecycle
        held = fenced(self.part.model, lease, self.running, self.using)
        return retry_transient(
            lambda: with_ids(held, [row.pk for row in rows]).update(
                state=life.ready,
                attempts=F("attempts") - 1,
                locked_until=None,
                lock_token=None,
                claimed_by=None,
            ),
            what=f"release {self.part.name} rows",
            reconnect=self.using,
        )

    # -- loops -----------------------------------------------------------------

    def drain(
        self, *, time_budget: float | None = None, max_batches: int | None = None
    ) -> RunResult:
        """Run batches until nothing is due, the budget (seconds) or *max_batches* is spent.

        With SKIP LOCKED (PostgreSQL, MariaDB), outside a transaction, the next
        batch is claimed by a helper thread while this one is processed and
        recorded: database and broker waits overlap.
        """
        budget = self.part.config.drain_seconds if time_budget is None else time_budget
        deadline = time.monotonic() + budget
        # The first batch runs here: an idle poll (nothing or little due) costs
        # one claim, no helper thread and no second database connection.
        total = self.run_batch()
        done = max_batches is not None and total.batches >= max_batches
        if not self._more(total) or done or time.monotonic() >= deadline:
            return total
        if self._can_prefetch():
            left = None if max_batches is None else max_batches - total.batches
            total += self._drain_prefetching(deadline, left)
            return total
        while max_batches is None or total.batches < max_batches:
            result = self.run_batch()
            total += result
            if not self._more(result) or time.monotonic() >= deadline:
                break
        return total

    def _more(self, result: RunResult) -> bool:
        """Whether a drain goes on after *result*: a full batch means more may be due."""
        return result.claimed >= self.batch_size

    def _can_prefetch(self) -> bool:
        connection = connections[self.using]
        # Another thread's connection cannot see rows of a transaction this
        # one holds open (a test case, a caller's atomic block); without
        # SKIP LOCKED (SQLite: a single writer) a second connection would only
        # queue behind the first.
        return (
            connection.features.has_select_for_update_skip_locked and not connection.in_atomic_block
        )

    def _drain_prefetching(self, deadline: float, max_batches: int | None) -> RunResult:
        batches: queue.Queue[tuple[list[Any], Lease] | BaseException | None]
        batches = queue.Queue(maxsize=1)
        stop = threading.Event()
        settled = threading.Condition()
        in_flight = 0  # batches claimed and not yet recorded

        def claimer() -> None:
            nonlocal in_flight
            try:
                claimed = 0
                wait_for_settle = False
                while not stop.is_set() and (max_batches is None or claimed < max_batches):
                    with settled:
                        # Prefetch one batch, no more: a batch waits at most one
                        # step for its turn, well inside its lease. After a short
                        # claim, wait until nothing is in flight (rows of a key
                        # may be waiting behind it), then claim again.
                        limit = 0 if wait_for_settle else 1
                        settled.wait_for(lambda: in_flight <= limit or stop.is_set())  # noqa: B023
                        idle = in_flight == 0
                    if stop.is_set():
                        break
                    rows, lease = self.claim_batch()
                    if rows:
                        claimed += 1
                        with settled:
                            in_flight += 1
                        batches.put((rows, lease))
                    short = len(rows) < self.batch_size
                    if (short and idle) or time.monotonic() >= deadline:
                        break  # as the sequential drain: a short batch with nothing ahead
                    wait_for_settle = short
            except BaseException as exc:  # re-raised in the processing thread
                batches.put(exc)
            finally:
                batches.put(None)
                connections[self.using].close()

        thread = threading.Thread(target=claimer, name="django-outbox-claimer", daemon=True)
        thread.start()
        total = self.result_class()
        try:
            while (item := batches.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                total += self._run(*item)
                with settled:
                    in_flight -= 1
                    settled.notify_all()
        finally:
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
                    try:
                        self.release(*item)
                    except Exception:  # keep draining so the claimer can finish
                        self.logger.exception("could not release a prefetched batch; rescue will")
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
