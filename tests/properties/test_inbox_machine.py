"""The inbox's state machine under any sequence of deliveries (duplicates and shuffled
sequences included), batches, crashed workers, rescues and operator actions, against
the real database.

Hypothesis delivers messages of an unordered type and of a ``strict`` key (each id
may arrive again), runs the real ``Inbox`` batches with handlers that succeed (one
``Payment`` row, in the handler's transaction), raise a retryable error or fail for
good as it chooses, leaves claims of workers that died before handling (with or
without a worker id), lets leases run out, rescues dead workers' claims, and lets an
operator requeue, skip or release gaps on random subsets. A model in Python predicts
each row; after every step the table agrees with it, one row per (source, message id),
one effect per handled message and none for any other, and a strict key's effects in
sequence order.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from unittest import mock

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

import django_outbox
from django_outbox.engine import clock, heartbeat, sweeps
from django_outbox.exceptions import RetryableError
from django_outbox.inbox.handlers import handler, unregister
from django_outbox.inbox.handling import Handling, Inbox
from django_outbox.models import InboxCursor, InboxMessage, InboxState
from testproject.shop.models import Payment

pytestmark = [pytest.mark.properties, pytest.mark.django_db(transaction=True)]

MAX_ATTEMPTS = 2
LEASE_SECONDS = 60.0
GAP_ALERT_SECONDS = 300.0
SOURCE = "peer"
PLAIN = "prop.plain"
STRICT = "prop.strict"
DEAD_WORKER = uuid.UUID(int=0xDEAD)

READY = InboxState.SHOULD_BE_HANDLED
HANDLED = InboxState.HANDLED
ERROR = InboxState.HANDLE_ERROR
SKIPPED = InboxState.SKIPPED
FINISHED = (HANDLED, SKIPPED)

SETTINGS = {
    "OUTBOX": {"DESTINATIONS": {"default": {"TRANSPORT": "memory"}}},
    "INBOX": {
        "SOURCES": {SOURCE: {"TRANSPORT": "local"}},
        "GAP_ALERT_SECONDS": GAP_ALERT_SECONDS,
        "MAX_ATTEMPTS": MAX_ATTEMPTS,
        "LEASE_SECONDS": LEASE_SECONDS,
        "RETRY_BASE_SECONDS": 1.0,
        "RETRY_MAX_SECONDS": 60.0,
        "BATCH_SIZE": 100,
    },
    "DISPATCH": "none",
}

#: What the handler does with each message id: "ok", "retry" or "fail" (default "ok").
script: dict[str, str] = {}


def handle(message: Any) -> None:
    outcome = script.get(message.message_id, "ok")
    if outcome == "retry":
        raise RetryableError("scripted: not yet")
    if outcome == "fail":
        raise ValueError("scripted: this message is wrong")
    Payment.objects.create(
        order_ref=message.message_id, status=message.type, sequence=message.sequence
    )


@dataclass
class Expected:
    message_id: str
    type: str
    key: str | None
    sequence: int | None
    due_at: datetime
    state: str = READY
    attempts: int = 0
    #: Held by the committed claim of a worker that died (until ``locked_until``).
    held_until: datetime | None = None
    #: The last attempt's worker died: it is handled alone next time.
    suspect: bool = False
    #: Its last wait was for a gap (``last_error``: waiting for sequence ...).
    waiting_for_gap: bool = False
    worker: uuid.UUID | None = None


class InboxMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        InboxMessage.objects.all().delete()
        InboxCursor.objects.all().delete()
        Payment.objects.all().delete()
        script.clear()
        self.now = clock.read_now("default").replace(microsecond=0) + timedelta(hours=1)
        self.rows: dict[str, Expected] = {}
        #: The strict key's cursor: the last sequence handled (or passed over).
        self.cursor = 0

    def inbox(self) -> Inbox:
        return Inbox(clock=lambda: self.now)

    # -- the model ------------------------------------------------------------------

    def due(self, row: Expected) -> bool:
        return (
            row.state == READY
            and row.due_at <= self.now
            and (row.held_until is None or row.held_until < self.now)
        )

    def claim_order(self) -> list[Expected]:
        """Due rows in the claim's order; a suspect goes alone (the first one)."""
        due = sorted(
            (row for row in self.rows.values() if self.due(row)),
            key=lambda r: (self.stored_available_at(r), self.pk_of(r)),
        )
        return due

    def stored_available_at(self, row: Expected) -> datetime:
        return self.available[row.message_id]

    def pk_of(self, row: Expected) -> int:
        return self.pks[row.message_id]

    def refresh(self) -> None:
        stored = InboxMessage.objects.values_list("message_id", "pk", "available_at")
        self.pks = {mid: pk for mid, pk, _ in stored}
        self.available = {mid: at for mid, _, at in stored}

    def pass_skipped(self) -> None:
        """The cursor moves over operator-skipped messages right after it."""
        while True:
            nxt = self.rows.get(f"s{self.cursor + 1}")
            if nxt is None or nxt.state != SKIPPED:
                return
            self.cursor += 1

    def wake_next(self) -> None:
        nxt = self.rows.get(f"s{self.cursor + 1}")
        if nxt is not None and nxt.state == READY:
            nxt.due_at = self.now  # woken, even if a dead worker's claim still holds it

    def attempt(self, row: Expected) -> None:
        """One handled attempt of *row* (counted at its claim), as the script says."""
        outcome = script.get(row.message_id, "ok")
        row.held_until = None
        row.suspect = False
        row.worker = None
        if row.type == STRICT:
            assert row.sequence is not None
            if row.sequence <= self.cursor:
                row.state = SKIPPED
                row.waiting_for_gap = False
                return
            if row.sequence > self.cursor + 1:
                row.attempts -= 1  # a wait is not an attempt
                row.due_at = self.now + timedelta(seconds=GAP_ALERT_SECONDS)
                row.waiting_for_gap = True
                return
        row.waiting_for_gap = False
        if outcome == "ok":
            row.state = HANDLED
            if row.type == STRICT:
                assert row.sequence is not None
                self.cursor = row.sequence
                self.pass_skipped()
                self.wake_next()
        elif outcome == "fail" or row.attempts >= MAX_ATTEMPTS:
            row.state = ERROR
        else:
            row.due_at = self.now + timedelta(seconds=61)  # placeholder: read back

    # -- rules ----------------------------------------------------------------------

    @initialize(
        messages=st.lists(st.one_of(st.none(), st.integers(1, 4)), max_size=5),
    )
    def some_messages_arrive(self, messages: list[int | None]) -> None:
        for sequence in messages:
            self.deliver(sequence)

    @rule(sequence=st.one_of(st.none(), st.integers(1, 5)), again=st.booleans())
    def deliver(self, sequence: int | None, again: bool = False) -> None:
        """A message arrives: unordered (a new id, or an id seen before when *again*), or
        sequence n of the strict key (id ``s<n>``: a second delivery is a duplicate)."""
        if sequence is None:
            plain = [mid for mid, row in self.rows.items() if row.type == PLAIN]
            mid = plain[-1] if again and plain else f"p{len(self.rows)}-{uuid.uuid4().hex[:6]}"
            kind, key = PLAIN, None
        else:
            mid, kind, key = f"s{sequence}", STRICT, "order-1"
        message, created = django_outbox.receive(
            kind, {"n": sequence}, source=SOURCE, message_id=mid, key=key, sequence=sequence
        )
        assert created == (mid not in self.rows), f"{mid}: created={created}"
        if created:
            self.rows[mid] = Expected(mid, kind, key, sequence, due_at=message.available_at)

    @rule(
        outcomes=st.lists(st.sampled_from(("ok", "ok", "retry", "fail")), max_size=10),
        later=st.sampled_from([0, 0, 61, 400]),
    )
    def run_batch(self, outcomes: list[str], later: int) -> None:
        self.now += timedelta(seconds=later)
        for row, outcome in zip(
            sorted(self.rows.values(), key=lambda r: r.message_id), outcomes, strict=False
        ):
            if row.state == READY:
                script[row.message_id] = outcome
        self.refresh()
        due = self.claim_order()
        worn = [row for row in due if row.suspect and row.attempts >= MAX_ATTEMPTS]
        rest = [row for row in due if row not in worn]
        alone = next((row for row in rest if row.suspect), None)
        batch = [alone] if alone is not None else rest
        result = self.inbox().run_batch()
        assert result.claimed == len(due) - (len(rest) - len(batch)), (result, due)
        for row in worn:
            row.state, row.held_until, row.suspect = ERROR, None, False
        for row in batch:
            row.attempts += 1
        # Handled in (key, sequence) order: unordered first by the part's sort, then the
        # strict key's run.
        ordered = sorted(batch, key=lambda r: (r.key is None, r.sequence or 0, self.pk_of(r)))
        for row in ordered:
            self.attempt(row)
        self.refresh()
        for row in batch:
            if row.state == READY and not row.waiting_for_gap and row.due_at > self.now:
                at = self.available[row.message_id]
                assert self.now < at <= self.now + timedelta(seconds=61), at
                row.due_at = at

    @rule(with_worker=st.booleans())
    def worker_dies_after_its_claim(self, with_worker: bool) -> None:
        """A worker's claim commits (attempts counted) and the worker dies before its
        batch's transaction: the rows are held until their lease runs out."""
        self.refresh()
        due = self.claim_order()
        worn = [row for row in due if row.suspect and row.attempts >= MAX_ATTEMPTS]
        rest = [row for row in due if row not in worn]
        alone = next((row for row in rest if row.suspect), None)
        batch = [alone] if alone is not None else rest
        patch = mock.patch.object(
            heartbeat, "current_worker_id", return_value=DEAD_WORKER if with_worker else None
        )
        with patch:
            claimed = self.inbox()._claim(None)
        assert {row.message_id for row in claimed.rows} == {row.message_id for row in batch}
        for row in worn:
            row.state, row.suspect = ERROR, False
        for row in batch:
            row.attempts += 1
            row.held_until = self.now + timedelta(seconds=LEASE_SECONDS)
            row.suspect = True
            row.worker = DEAD_WORKER if with_worker else None

    @rule(seconds=st.sampled_from([1, 30, 61, 400]))
    def time_passes(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @rule()
    def rescue_dead_worker(self) -> None:
        released = sweeps.rescue_stuck(Handling(), dead_workers=[DEAD_WORKER], at=self.now)
        freed = [
            row
            for row in self.rows.values()
            if row.state == READY and row.held_until is not None and row.worker == DEAD_WORKER
        ]
        assert released.ready == len(freed)
        for row in freed:
            row.held_until = None

    def choose(self, data: st.DataObject) -> list[Expected]:
        names = sorted(self.rows) or ["-"]
        chosen = data.draw(st.sets(st.sampled_from(names), max_size=3))
        return [self.rows[mid] for mid in chosen if mid in self.rows]

    @rule(data=st.data())
    def operator_requeues(self, data: st.DataObject) -> None:
        chosen = self.choose(data)
        moved = InboxMessage.objects.filter(message_id__in=[r.message_id for r in chosen]).requeue(
            now=self.now
        )
        expected = [row for row in chosen if row.state == ERROR]
        assert moved == len(expected)
        for row in expected:
            row.state, row.attempts, row.due_at, row.suspect = READY, 0, self.now, False

    @rule(data=st.data())
    def operator_skips(self, data: st.DataObject) -> None:
        chosen = self.choose(data)
        moved = InboxMessage.objects.filter(message_id__in=[r.message_id for r in chosen]).skip(
            now=self.now
        )
        expected = [row for row in chosen if row.state in (READY, ERROR)]
        assert moved == len(expected)
        for row in expected:
            row.state, row.held_until, row.suspect = SKIPPED, None, False
            row.waiting_for_gap = False
        if any(row.type == STRICT and row.sequence == self.cursor + 1 for row in expected):
            self.pass_skipped()
            self.wake_next()

    @rule()
    def operator_releases_gaps(self) -> None:
        released = InboxMessage.objects.all().release_gaps(now=self.now)
        waiting = [row for row in self.rows.values() if row.state == READY and row.waiting_for_gap]
        assert released == len(waiting)
        for row in sorted(waiting, key=lambda r: r.sequence or 0):
            assert row.sequence is not None
            self.cursor = max(self.cursor, row.sequence - 1)
            row.due_at = self.now
            row.waiting_for_gap = False

    # -- invariants -----------------------------------------------------------------

    @invariant()
    def table_agrees_with_the_model(self) -> None:
        stored = list(InboxMessage.objects.order_by("pk"))
        ids = [(m.source, m.message_id) for m in stored]
        assert len(ids) == len(set(ids)), "one (source, message id) stored twice"
        assert {mid for _, mid in ids} == set(self.rows), "a message was lost or appeared"
        effects: dict[str, int] = {}
        for ref in Payment.objects.values_list("order_ref", flat=True):
            effects[ref] = effects.get(ref, 0) + 1
        for m in stored:
            row = self.rows[m.message_id]
            assert (m.state, m.attempts) == (row.state, row.attempts), (m.message_id, m.state, row)
            assert 0 <= m.attempts <= MAX_ATTEMPTS
            assert effects.get(m.message_id, 0) == (1 if m.state == HANDLED else 0), m.message_id
            if m.state in FINISHED:
                assert m.finished_at is not None
            if m.state != HANDLED:
                held = row.held_until is not None
                assert (m.lock_token is not None) == held, (m.message_id, m.lock_token, row)
                assert (m.locked_until is not None) == held
            if m.state == READY:
                assert (m.available_at <= self.now) == (row.due_at <= self.now), (m.message_id,)
            else:
                assert not m.attempt_open
        cursor = InboxCursor.objects.filter(source=SOURCE, key="order-1").first()
        assert (cursor.last_sequence if cursor else 0) == self.cursor

    @invariant()
    def a_strict_key_takes_effect_in_order(self) -> None:
        sequences = list(
            Payment.objects.filter(status=STRICT).order_by("pk").values_list("sequence", flat=True)
        )
        assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)


def test_the_inbox_state_machine(settings: Any) -> None:
    settings.DJANGO_OUTBOX = json.loads(json.dumps(SETTINGS))
    handler(PLAIN)(handle)
    handler(STRICT, ordering="strict")(handle)
    try:
        run_state_machine_as_test(InboxMachine)
    finally:
        unregister(PLAIN)
        unregister(STRICT)
