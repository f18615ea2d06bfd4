"""Lock mode: the step runs inside the claiming transaction, under the row locks.

Some steps must commit together with their row's new state: an inbox
handler's database effects and the ``handled`` mark are one commit, or a
crash between them would handle a message twice. For such a part (its
``Lifecycle.running`` is ``None``) one cycle is one transaction:

1. claim up to ``BATCH_SIZE`` due rows with ``SELECT … FOR UPDATE SKIP LOCKED``
   (other workers pass over them; SQLite, a single writer, needs no skip);
2. the part's ``process`` does each row, normally in a savepoint of its own,
   and yields the outcomes;
3. the outcomes are written (attempts, backoff, dead-letter: the same rules
   as in lease mode), then everything commits.

The row lock is the lease. A worker that dies mid-batch loses its
connection, the database rolls the transaction back (effects included), and
the rows are due again at once: there is no running state, nothing to
rescue and nothing to fence. The price: a batch holds its transaction for
as long as its handlers run, so keep handlers short (long work belongs in a
job).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from django_outbox.engine import clock
from django_outbox.engine.lease import update_each, with_ids
from django_outbox.engine.part import Defer, Outcomes, Part, Skip
from django_outbox.engine.retry import retry_transient
from django_outbox.engine.runner import ERROR_CHARS, Runner, RunResult


@dataclass
class LockedResult(RunResult):
    """Counts of lock-mode cycles."""

    skipped: int = 0
    #: Rows that asked to wait (``Defer``): not an attempt.
    deferred: int = 0


class LockedRunner(Runner):
    """Runs a lock-mode part's batches, one transaction per batch."""

    result_class: type[LockedResult] = LockedResult

    def __init__(self, part: Part) -> None:
        if part.lifecycle.running is not None:
            raise TypeError(f"{part.name} runs under leases: drive it with a Runner")
        super().__init__(part)

    def run_batch(self, ids: Sequence[Any] | None = None) -> RunResult:
        # A deadlock victim's or a lost connection's batch was rolled back whole,
        # handlers' effects included: running it again is safe.
        return retry_transient(
            lambda: self._run_locked(ids), what=f"{self.part.name} batch", reconnect=self.using
        )

    def _run_locked(self, ids: Sequence[Any] | None) -> RunResult:
        with transaction.atomic(using=self.using):
            rows = list(self._claimable(ids).select_for_update(skip_locked=True)[: self.batch_size])
            result, done, failed = self._process(rows)
        # Hooks run once the outcomes (and the steps' effects) are committed.
        self._after_commit(done, failed)
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
        result, done, failed = self._process(list(rows))
        transaction.on_commit(lambda: self._after_commit(done, failed), using=self.using)
        return result

    def _process(
        self, rows: list[Any]
    ) -> tuple[LockedResult, list[Any], list[tuple[Any, str, bool]]]:
        """Run the part's step on *rows* and write the outcomes (inside a transaction)."""
        part = self.part
        result = self.result_class(claimed=len(rows), batches=1 if rows else 0)
        if not rows:
            return result, [], []
        deadline = time.monotonic() + part.config.lease_seconds
        outcomes: Outcomes = {}
        for group in part.process(rows, deadline):
            outcomes.update(group)
        attempted = [row for row in rows if row.pk in outcomes]
        result.released = len(rows) - len(attempted)
        done, failed = self._write(attempted, outcomes, result)
        return result, done, failed

    def _after_commit(self, done: list[Any], failed: list[tuple[Any, str, bool]]) -> None:
        if done:
            self.part.on_done(done)
        for row, text, retry in failed:
            self.part.on_failed(row, text, retry)

    def _write(
        self, rows: Sequence[Any], outcomes: Outcomes, result: LockedResult
    ) -> tuple[list[Any], list[tuple[Any, str, bool]]]:
        """Write the outcomes of *rows* inside the batch's transaction."""
        part = self.part
        life = part.lifecycle
        now = part.now()
        done: list[Any] = []
        failed: list[tuple[Any, str, bool]] = []
        changes: dict[Any, dict[str, Any]] = {}
        for row in rows:
            outcome = outcomes[row.pk]
            if isinstance(outcome, Defer):
                # Not an attempt: it waits for something else (a gap in its key).
                changes[row.pk] = {
                    "available_at": clock.later(now, outcome.seconds),
                    "last_error": outcome.reason[:ERROR_CHARS],
                }
                result.deferred += 1
                continue
            row.attempts += 1
            if outcome is None:
                done.append(row)
                changes[row.pk] = {
                    "state": life.done,
                    "attempts": row.attempts,
                    "last_error": "",
                    **part.done_values(now),
                }
            elif isinstance(outcome, Skip):
                if life.skipped is None:
                    raise TypeError(f"{part.name} has no skipped state for {outcome!r}")
                changes[row.pk] = {
                    "state": life.skipped,
                    "attempts": row.attempts,
                    "last_error": outcome.reason[:ERROR_CHARS],
                    **part.done_values(now),
                }
                result.skipped += 1
            else:
                change, text, retry = self._failure(row, outcome, now)
                changes[row.pk] = {
                    **change,
                    "attempts": row.attempts,
                    "last_error": text,
                    **part.failed_values(row, outcome),
                }
                failed.append((row, text, retry))
                if retry:
                    result.retried += 1
                else:
                    result.failed += 1
        ready = part.model._default_manager.using(self.using).filter(state=life.ready)
        update_each(with_ids(ready, list(changes)), changes)
        result.done += len(done)
        return done, failed

    def release(self, rows: Sequence[Any], lease: Any = None) -> int:
        """Nothing to give back: rows the step did not reach stay due when the batch commits."""
        return 0

    def _more(self, result: RunResult) -> bool:
        # A full batch of rows that all chose to wait says nothing more is ready.
        deferred = getattr(result, "deferred", 0)
        return result.claimed >= self.batch_size and result.claimed > deferred

    def _can_prefetch(self) -> bool:
        return False  # a prefetched batch would hold its row locks while it waits
