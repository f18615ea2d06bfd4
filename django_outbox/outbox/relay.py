"""The relay: claim due messages in batches, publish them, record the outcomes.

One cycle (``Relay.run_batch``) is: claim up to ``BATCH_SIZE`` due messages
under a lease in one short transaction, publish them per destination, then
record every outcome in a few UPDATEs fenced by the lease token, so a relay
whose lease was taken over changes nothing.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from django_outbox import signals
from django_outbox.conf import OutboxSettings, get_settings
from django_outbox.engine import (
    Lease,
    backoff_delay,
    claim,
    fenced,
    retry_transient,
    update_each,
    with_ids,
)
from django_outbox.exceptions import (
    ConfigurationError,
    DeliveryError,
    RetryableError,
    UncertainError,
    UnknownDestination,
)
from django_outbox.outbox.envelope import Envelope
from django_outbox.outbox.models import (
    UNFINISHED_STATES,
    OutboxMessage,
    OutboxMessageQuerySet,
    OutboxState,
)
from django_outbox.outbox.transports.base import Outcomes
from django_outbox.outbox.transports.registry import get_transport

logger = logging.getLogger("django_outbox.relay")

ERROR_CHARS = 4000
#: Columns a claim reads back: what envelopes, outcomes and signals need.
CLAIMED_FIELDS = (
    "id",
    "message_id",
    "type",
    "destination",
    "payload",
    "headers",
    "key",
    "sequence",
    "correlation_id",
    "attempts",
    "created_at",
)


@dataclass
class RelayResult:
    """Counts of one or more relay cycles."""

    claimed: int = 0
    sent: int = 0
    retried: int = 0
    failed: int = 0
    #: Claimed but not attempted: an earlier message of the key failed.
    released: int = 0
    #: Outcomes not recorded because the lease had been taken over.
    fenced: int = 0
    batches: int = 0

    def __iadd__(self, other: RelayResult) -> RelayResult:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class Relay:
    """Moves outbox rows to their transports. Cheap to build; reuse it in loops."""

    def __init__(
        self,
        *,
        using: str = DEFAULT_DB_ALIAS,
        batch_size: int | None = None,
        config: OutboxSettings | None = None,
        clock: Callable[[], datetime] = timezone.now,
        rng: random.Random | None = None,
    ) -> None:
        self.using = using
        self.config = config or get_settings()
        self.batch_size = batch_size or self.config.batch_size
        self.clock = clock
        self.rng = rng or random.Random()

    # -- selection ---------------------------------------------------------

    def claimable(self, now: datetime) -> OutboxMessageQuerySet:
        """Due messages whose key has no earlier unfinished message, oldest first."""
        earlier_open = OutboxMessage.objects.filter(
            destination=OuterRef("destination"),
            key=OuterRef("key"),
            sequence__lt=OuterRef("sequence"),
            state__in=UNFINISHED_STATES,
        )
        return (
            OutboxMessage.objects.using(self.using)
            .due(now)
            .filter(Q(key__isnull=True) | ~Exists(earlier_open))
            .order_by("available_at", "id")
        )

    def _claim(self, now: datetime, lease: Lease, ids: Sequence[int] | None) -> list[OutboxMessage]:
        queryset = self.claimable(now)
        if ids is not None:
            queryset = queryset.filter(pk__in=ids)
        # One statement (or one transaction): a deadlock victim's claim was
        # rolled back whole, so running it again under the same lease is safe.
        rows = retry_transient(
            lambda: claim(
                queryset,
                lease=lease,
                limit=self.batch_size,
                running_state=OutboxState.SENDING,
                fields=CLAIMED_FIELDS,
            ),
            what="claim",
        )
        room = self.batch_size - len(rows)
        if room > 0 and any(row.key is not None for row in rows):
            # A separate statement is safe: the heads are ours (``sending``)
            # until we record them, so no one else can claim their followers.
            # Followers are an optimisation: if claiming them fails, the heads
            # go out alone and the followers come in a later batch.
            try:
                rows += self._claim_followers(rows, now, lease, room)
            except DatabaseError:
                logger.warning("claiming followers failed; sending the heads alone", exc_info=True)
        return rows

    def _claim_followers(
        self, heads: Sequence[OutboxMessage], now: datetime, lease: Lease, room: int
    ) -> list[OutboxMessage]:
        """Claim the due messages right behind the keyed heads we hold.

        No other relay can claim them: their earlier message (our head) is
        unfinished, so they fail every other claimer's ordering test.
        """
        tails = {(r.destination, r.key): r.sequence for r in heads if r.key is not None}
        behind = Q()
        for (destination, key), sequence in tails.items():
            behind |= Q(destination=destination, key=key, sequence__gt=sequence)
        candidates = (
            OutboxMessage.objects.using(self.using)
            .filter(behind, state__in=UNFINISHED_STATES)
            .order_by("destination", "key", "sequence")
            .only("id", "destination", "key", "sequence", "state", "available_at")[: room * 4]
        )
        chosen: list[int] = []
        chosen_slots: list[tuple[int, tuple[str, str | None]]] = []
        blocked: set[tuple[str, str | None]] = set()
        for row in candidates:
            slot = (row.destination, row.key)
            if slot in blocked:
                continue
            if row.state != OutboxState.SHOULD_BE_SENT or row.available_at > now:
                blocked.add(slot)
                continue
            chosen.append(row.pk)
            chosen_slots.append((row.pk, slot))
            if len(chosen) >= room:
                break
        if not chosen:
            return []
        followers = OutboxMessage.objects.using(self.using).filter(
            pk__in=chosen, state=OutboxState.SHOULD_BE_SENT
        )
        got = claim(
            followers,
            lease=lease,
            limit=room,
            running_state=OutboxState.SENDING,
            fields=CLAIMED_FIELDS,
        )
        # SKIP LOCKED may pass over a follower another claimer's scan has
        # locked for a moment (InnoDB locks every row a locking read scans).
        # Keep, per key, only the unbroken run behind the head; the rest goes
        # straight back, unattempted, to be claimed in order later.
        taken = {row.pk for row in got}
        keep: set[int] = set()
        broken: set[tuple[str, str | None]] = set()
        for pk, slot in chosen_slots:
            if pk in taken and slot not in broken:
                keep.add(pk)
            else:
                broken.add(slot)
        extra = [row for row in got if row.pk not in keep]
        if extra:
            self._release(extra, lease)
        return [row for row in got if row.pk in keep]

    # -- the cycle ---------------------------------------------------------

    def run_batch(self, ids: Sequence[int] | None = None) -> RelayResult:
        """Claim one batch (restricted to *ids* if given), publish it, record outcomes."""
        return self._deliver(*self._claim_batch(ids))

    def _claim_batch(self, ids: Sequence[int] | None = None) -> tuple[list[OutboxMessage], Lease]:
        now = self.clock()
        lease = Lease.new(now, self.config.lease_seconds)
        return self._claim(now, lease, ids), lease

    def _deliver(self, rows: list[OutboxMessage], lease: Lease) -> RelayResult:
        result = RelayResult(claimed=len(rows), batches=1 if rows else 0)
        if not rows:
            return result
        by_destination: dict[str, list[OutboxMessage]] = defaultdict(list)
        for row in rows:
            by_destination[row.destination].append(row)
        for destination, messages in by_destination.items():
            messages.sort(key=_publish_order)
            outcomes = self._publish(destination, messages, self._deadline(lease))
            signals.emit(
                signals.outbox_batch_published,
                Relay,
                destination=destination,
                messages=messages,
                outcomes=outcomes,
            )
            result += self._record(destination, messages, outcomes, lease)
        return result

    def _deadline(self, lease: Lease) -> float:
        """Monotonic time after which no new message of the batch is started:
        the lease's end less a fifth of its length as a margin for recording."""
        left = (lease.until - self.clock()).total_seconds() - self.config.lease_seconds / 5
        return time.monotonic() + max(left, 0.0)

    def _publish(
        self, destination: str, messages: Sequence[OutboxMessage], deadline: float
    ) -> Outcomes:
        try:
            config = self.config.destination(destination)
            transport = get_transport(config)
        except UnknownDestination as exc:
            # Another process accepted it in send(): during a rolling deploy an
            # older relay may not know a new destination yet. Retry, do not bury.
            return dict.fromkeys((m.message_id for m in messages), RetryableError(str(exc)))
        except ConfigurationError as exc:
            return dict.fromkeys((m.message_id for m in messages), RetryableError(str(exc)))
        except Exception as exc:  # building the transport failed: nothing was sent
            logger.exception("cannot build the transport of %r", destination)
            error = RetryableError(f"transport unavailable: {type(exc).__name__}: {exc}")
            return dict.fromkeys((m.message_id for m in messages), error)
        if time.monotonic() >= deadline:
            # An earlier destination of this batch used up the lease: leave
            # these unattempted rather than publish after the lease ran out.
            return {}
        envelopes = [Envelope.from_message(m) for m in messages]
        try:
            return transport.publish(envelopes, deadline)
        except Exception as exc:  # a transport bug must not leave rows stuck in sending
            logger.exception("transport for %r raised", destination)
            # Some of the batch may have gone out before it raised.
            error = UncertainError(f"{type(exc).__name__}: {exc}")
            return dict.fromkeys((e.message_id for e in envelopes), error)

    def _record(
        self,
        destination: str,
        messages: Sequence[OutboxMessage],
        outcomes: Outcomes,
        lease: Lease,
    ) -> RelayResult:
        now = self.clock()
        result = RelayResult()
        # Rows of this destination still under our lease: the fence. Selecting
        # by token (a small partial index) keeps long id lists off the wire.
        held = fenced(OutboxMessage, lease, OutboxState.SENDING, self.using).filter(
            destination=destination
        )
        sent = [m for m in messages if m.message_id in outcomes and outcomes[m.message_id] is None]
        untried = [m for m in messages if m.message_id not in outcomes]
        failures = [(m, outcomes[m.message_id]) for m in messages if outcomes.get(m.message_id)]
        max_attempts = self._max_attempts(destination)
        holds = self._holds_uncertain(destination)
        changes: dict[int, dict[str, Any]] = {}
        failed_signals: list[tuple[OutboxMessage, str, bool]] = []
        for message, error in failures:
            assert error is not None
            text = _error_text(error)
            uncertain = isinstance(error, UncertainError)
            if uncertain and holds:
                changes[message.pk] = {
                    "state": OutboxState.SEND_ERROR,
                    "uncertain": True,
                    "last_error": f"outcome uncertain, held for an operator: {text}",
                    "locked_until": None,
                    "lock_token": None,
                }
                result.failed += 1
                failed_signals.append((message, text, False))
                continue
            retry = isinstance(error, RetryableError) and message.attempts < max_attempts
            if retry:
                delay = backoff_delay(
                    message.attempts,
                    base=self.config.retry_base_seconds,
                    maximum=self.config.retry_max_seconds,
                    rng=self.rng,
                )
                change = {
                    "state": OutboxState.SHOULD_BE_SENT,
                    "available_at": now + timedelta(seconds=delay),
                    "last_error": text,
                }
                result.retried += 1
            else:
                if isinstance(error, RetryableError):
                    text = f"gave up after {message.attempts} attempts: {text}"
                change = {"state": OutboxState.SEND_ERROR, "last_error": text}
                result.failed += 1
            changes[message.pk] = {**change, "locked_until": None, "lock_token": None}
            failed_signals.append((message, text, retry))

        statements = (1 if sent else 0) + (1 if untried else 0) + (1 if changes else 0)

        def write() -> tuple[int, int]:
            scope = transaction.atomic(using=self.using) if statements > 1 else nullcontext()
            with scope:
                recorded = recorded_sent = 0
                if sent:
                    # Always by id as well as by token: rows under this lease
                    # that are not in this batch were never published.
                    recorded_sent = with_ids(held, [m.pk for m in sent]).update(
                        state=OutboxState.SENT,
                        sent_at=now,
                        finished_at=now,
                        locked_until=None,
                        lock_token=None,
                    )
                    recorded += recorded_sent
                if untried:
                    recorded += with_ids(held, [m.pk for m in untried]).update(
                        state=OutboxState.SHOULD_BE_SENT,
                        attempts=F("attempts") - 1,
                        locked_until=None,
                        lock_token=None,
                    )
                recorded += update_each(held, changes)
                return recorded, recorded_sent

        # Every write is fenced by the lease token and a deadlock victim's
        # transaction is rolled back whole, so repeating it records each
        # outcome once.
        recorded, recorded_sent = retry_transient(write, what="record outcomes")
        if recorded_sent < len(sent):
            # Some leases were taken over: report only what this relay recorded.
            mine = set(
                OutboxMessage.objects.using(self.using)
                .filter(pk__in=[m.pk for m in sent], state=OutboxState.SENT, sent_at=now)
                .values_list("pk", flat=True)
            )
            sent = [m for m in sent if m.pk in mine]
        result.sent = len(sent)
        result.released = len(untried)
        result.fenced = len(messages) - recorded
        if result.fenced:
            logger.warning(
                "%d outcome(s) for %r not recorded: the lease expired and was taken over",
                result.fenced,
                destination,
            )
        if sent:
            signals.emit(signals.outbox_messages_sent, Relay, messages=sent)
            logger.debug("sent %d message(s) to %r", len(sent), destination)
        for message, text, retry in failed_signals:
            log = logger.warning if retry else logger.error
            log(
                "message %s (%s → %s) attempt %d failed%s: %s",
                message.message_id,
                message.type,
                destination,
                message.attempts,
                ", will retry" if retry else ", moved to send_error",
                text,
            )
            signals.emit(
                signals.outbox_message_failed, Relay, message=message, error=text, will_retry=retry
            )
        return result

    def _holds_uncertain(self, destination: str) -> bool:
        config = self.config.destinations.get(destination)
        return config is not None and config.uncertain == "hold"

    def _max_attempts(self, destination: str) -> int:
        config = self.config.destinations.get(destination)
        return config.max_attempts if config else self.config.max_attempts

    # -- loops -------------------------------------------------------------

    def drain(
        self, *, time_budget: float | None = None, max_batches: int | None = None
    ) -> RelayResult:
        """Run batches until nothing is due, the budget (seconds) or *max_batches* is spent.

        With SKIP LOCKED (PostgreSQL, MariaDB), outside a transaction, the next
        batch is claimed by a helper thread while this one is published and
        recorded: database and broker waits overlap, and one process moves far
        more per second.
        """
        budget = self.config.drain_seconds if time_budget is None else time_budget
        deadline = time.monotonic() + budget
        # The first batch runs here: an idle poll (nothing or little due) costs
        # one claim, no helper thread and no second database connection.
        total = self.run_batch()
        done = max_batches is not None and total.batches >= max_batches
        if total.claimed < self.batch_size or done or time.monotonic() >= deadline:
            return total
        if self._can_prefetch():
            left = None if max_batches is None else max_batches - total.batches
            total += self._drain_prefetching(deadline, left)
            return total
        while max_batches is None or total.batches < max_batches:
            result = self.run_batch()
            total += result
            if result.claimed < self.batch_size or time.monotonic() >= deadline:
                break
        return total

    def _can_prefetch(self) -> bool:
        connection = connections[self.using]
        # Another thread's connection cannot see rows of a transaction this
        # one holds open (a test case, a caller's atomic block); without
        # SKIP LOCKED (SQLite: a single writer) a second connection would only
        # queue behind the first.
        return (
            connection.features.has_select_for_update_skip_locked and not connection.in_atomic_block
        )

    def _drain_prefetching(self, deadline: float, max_batches: int | None) -> RelayResult:
        batches: queue.Queue[tuple[list[OutboxMessage], Lease] | BaseException | None]
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
                        # publish for its turn, well inside its lease. After a
                        # short claim, wait until nothing is in flight (messages
                        # of a key may be waiting behind it), then claim again.
                        limit = 0 if wait_for_settle else 1
                        settled.wait_for(lambda: in_flight <= limit or stop.is_set())  # noqa: B023
                        idle = in_flight == 0
                    if stop.is_set():
                        break
                    rows, lease = self._claim_batch()
                    if rows:
                        claimed += 1
                        with settled:
                            in_flight += 1
                        batches.put((rows, lease))
                    short = len(rows) < self.batch_size
                    if (short and idle) or time.monotonic() >= deadline:
                        break  # as the sequential drain: a short batch with nothing ahead
                    wait_for_settle = short
            except BaseException as exc:  # re-raised in the publishing thread
                batches.put(exc)
            finally:
                batches.put(None)
                connections[self.using].close()

        thread = threading.Thread(target=claimer, name="django-outbox-claimer", daemon=True)
        thread.start()
        total = RelayResult()
        try:
            while (item := batches.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                total += self._deliver(*item)
                with settled:
                    in_flight -= 1
                    settled.notify_all()
        finally:
            stop.set()
            with settled:
                settled.notify_all()
            # Rows the claimer took but we never published go back at once.
            while thread.is_alive() or not batches.empty():
                try:
                    item = batches.get(timeout=0.1)
                except queue.Empty:
                    continue
                if isinstance(item, tuple):
                    try:
                        self._release(*item)
                    except Exception:  # keep draining so the claimer can finish
                        logger.exception("could not release a prefetched batch; the sweep will")
            thread.join()
        return total

    def _release(self, rows: list[OutboxMessage], lease: Lease) -> None:
        """Give claimed, unattempted *rows* back at once (their attempt uncounted)."""
        held = fenced(OutboxMessage, lease, OutboxState.SENDING, self.using)
        retry_transient(
            lambda: with_ids(held, [row.pk for row in rows]).update(
                state=OutboxState.SHOULD_BE_SENT,
                attempts=F("attempts") - 1,
                locked_until=None,
                lock_token=None,
            ),
            what="release",
        )

    def deliver(self, ids: Iterable[int]) -> RelayResult:
        """Deliver the messages *ids* (an on-commit trigger), then drain what else is due.

        If another relay already took all of *ids*, return at once: under load
        many triggers collapse into the few relays that are draining.
        """
        wanted = sorted(set(ids))
        total = RelayResult()
        for start in range(0, len(wanted), self.batch_size):
            total += self.run_batch(wanted[start : start + self.batch_size])
        if total.claimed == 0:
            return total
        total += self.drain()
        return total


def _publish_order(message: OutboxMessage) -> tuple[Any, ...]:
    # Keyed messages in (key, sequence) order; the rest keep their claim order.
    return (message.key is not None, message.key or "", message.sequence or 0, message.pk)


def _error_text(error: DeliveryError) -> str:
    text = str(error) or type(error).__name__
    return text[:ERROR_CHARS]


__all__ = ["Relay", "RelayResult"]
