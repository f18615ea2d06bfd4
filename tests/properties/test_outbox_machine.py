"""The outbox's state machine under any sequence of sends, batches, crashes, rescues and
operator actions, against the real database.

Hypothesis drives the real relay (``Relay.run_batch`` with a scripted transport that
succeeds, fails, or leaves the outcome uncertain per message), claims abandoned by a
relay that died (with or without a worker id, with some messages published before it
died), the lease sweep and the dead-worker rescue, late writes of a relay whose lease
was taken over (any outcome, keyed heads included, while its keys go on), the
operator's requeue and cancel on random subsets, and the purge. A model kept in
Python predicts every row's state, attempts and marks; after every step the table
must agree with it and be legal on its own: every message exactly once, lease fields
set exactly while ``sending``, attempts bounded, no key wedged, no message parked but
behind a failed one of its key, per-key order kept on the wire, a second successful
publish only after a crash.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from unittest import mock

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import django_outbox
from django_outbox.engine import clock, heartbeat, partitions, sweeps
from django_outbox.engine.outcomes import DONE, Fail, Outcome, Retry, Uncertain
from django_outbox.models import OutboxKey, OutboxMessage, OutboxState
from django_outbox.outbox.maintenance import purge_finished_messages, rescue_stuck_messages
from django_outbox.outbox.relay import Publishing, Relay, _publish_order
from tests.properties import scripted

pytestmark = [pytest.mark.properties, pytest.mark.django_db(transaction=True)]

MAX_ATTEMPTS = 2
LEASE_SECONDS = 60.0
RETRY_MAX_SECONDS = 60.0
DESTINATIONS = ("resend", "held")
KEYS = (None, "a", "b")
OUTCOMES = ("ok", "ok", "retry", "fail", "uncertain")
#: What a late writer may record for a row it attempted (the transport's answers); a row
#: it never reached it gives back.
LATE = {
    "ok": DONE,
    "retry": Retry("scripted: the broker said try again"),
    "fail": Fail("scripted: the broker refused it"),
    "uncertain": Uncertain("scripted: no confirm came back"),
}
#: The worker id a relay that died carried (no worker row: it never declared a start).
DEAD_WORKER = uuid.UUID(int=0xDEAD)

READY = OutboxState.SHOULD_BE_SENT
SENDING = OutboxState.SENDING
SENT = OutboxState.SENT
ERROR = OutboxState.SEND_ERROR
CANCELLED = OutboxState.CANCELLED
UNFINISHED = (READY, SENDING, ERROR)
FINISHED = (SENT, CANCELLED)

TRANSPORT = "tests.properties.scripted.ScriptedTransport"
SETTINGS = {
    "OUTBOX": {
        "DESTINATIONS": {
            "resend": {"TRANSPORT": TRANSPORT},
            "held": {"TRANSPORT": TRANSPORT, "UNCERTAIN": "hold"},
        },
    },
    "DISPATCH": "none",
    "BATCH_SIZE": 100,
    "LEASE_SECONDS": LEASE_SECONDS,
    "RETRY_BASE_SECONDS": 1.0,
    "RETRY_MAX_SECONDS": RETRY_MAX_SECONDS,
    "MAX_ATTEMPTS": MAX_ATTEMPTS,
}


@dataclass
class Expected:
    """What the model says one message is."""

    pk: int
    message_id: uuid.UUID
    destination: str
    key: str | None
    sequence: int | None
    available_at: datetime
    state: str = READY
    attempts: int = 0
    uncertain: bool = False
    #: A keyed message that failed and is not finished: it holds its key back.
    blocking: bool = False
    #: The lease holding it (``sending``), and the worker id its claim carried.
    token: uuid.UUID | None = None
    worker: uuid.UUID | None = None
    locked_until: datetime | None = None
    finished_at: datetime | None = None
    #: Successful publishes (a second one is allowed only after a holder died).
    published: int = 0
    #: A holder died while it was claimed: from then on it may be published again.
    crashed: bool = False

    @property
    def slot(self) -> tuple[str, str] | None:
        return (self.destination, self.key) if self.key is not None else None


@dataclass
class Abandoned:
    """A claim whose relay died: its rows, its lease, when it claimed them, and what it
    published first."""

    rows: list[Any]
    lease: Any
    at: datetime
    published: set[uuid.UUID] = field(default_factory=set)


@contextmanager
def claims_carry(worker: uuid.UUID | None) -> Iterator[None]:
    """Claims made inside carry *worker* as their worker id (a process with a heartbeat)."""
    if worker is None:
        yield
        return
    with mock.patch.object(heartbeat, "current_worker_id", return_value=worker):
        yield


class OutboxMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        OutboxMessage.objects.all().delete()
        OutboxKey.objects.all().delete()
        scripted.reset()
        # Ahead of the database's clock: a message sent during the run is due at once.
        self.now = clock.read_now("default").replace(microsecond=0) + timedelta(hours=1)
        self.rows: dict[uuid.UUID, Expected] = {}
        self.abandoned: list[Abandoned] = []

    def relay(self) -> Relay:
        return Relay(clock=lambda: self.now)

    # -- what the model predicts ---------------------------------------------------

    def by_pk(self) -> dict[int, Expected]:
        return {row.pk: row for row in self.rows.values()}

    def keys(self) -> dict[tuple[str, str], list[Expected]]:
        keys: dict[tuple[str, str], list[Expected]] = defaultdict(list)
        for row in self.rows.values():
            if row.slot is not None:
                keys[row.slot].append(row)
        for rows in keys.values():
            rows.sort(key=lambda r: r.sequence or 0)
        return keys

    def due(self, row: Expected) -> bool:
        return row.state == READY and row.available_at <= self.now

    def claimable(self) -> list[list[Expected]]:
        """Runs a relay must claim now: each unkeyed due message alone, and per key the
        head (if due) with the due messages right behind it."""
        runs = [[row] for row in self.rows.values() if row.key is None and self.due(row)]
        for rows in self.keys().values():
            unfinished = [row for row in rows if row.state in UNFINISHED]
            if not unfinished or not self.due(unfinished[0]):
                continue
            run = []
            for row in unfinished:
                if not self.due(row):
                    break
                run.append(row)
            runs.append(run)
        return runs

    def check_order(self, published: list[tuple[uuid.UUID, str]]) -> None:
        """Each publish of a keyed message comes after every earlier message of its key
        finished, or was published successfully earlier in the same batch."""
        before = {mid: row.state for mid, row in self.rows.items()}
        went_out: set[uuid.UUID] = set()
        for mid, outcome in published:
            row = self.rows[mid]
            if row.slot is not None:
                for other in self.keys()[row.slot]:
                    if other.sequence is not None and other.sequence < (row.sequence or 0):
                        assert before[other.message_id] in FINISHED or (
                            other.message_id in went_out
                        ), f"{mid} (seq {row.sequence}) published before seq {other.sequence}"
            if outcome == "ok":
                went_out.add(mid)

    def published_ok(self, row: Expected) -> None:
        row.published += 1
        assert row.published == 1 or row.crashed, f"{row.message_id} sent twice, no crash"

    def failed(self, row: Expected, outcome: str) -> None:
        """An attempt (already counted) of *row* ended with *outcome* (not ``ok``)."""
        row.token = row.worker = row.locked_until = None
        row.blocking = row.key is not None
        if outcome == "fail":
            row.state = ERROR
        elif outcome == "uncertain" and row.destination == "held":
            row.state, row.uncertain = ERROR, True
        elif row.attempts >= MAX_ATTEMPTS:
            row.state = ERROR
            row.uncertain = row.uncertain or outcome == "uncertain"
        else:
            row.state = READY  # available_at: read back, checked against the backoff

    def done(self, row: Expected) -> None:
        row.state, row.finished_at, row.blocking = SENT, self.now, False
        row.token = row.worker = row.locked_until = None

    # -- rules ----------------------------------------------------------------------

    @rule(destination=st.sampled_from(DESTINATIONS), key=st.sampled_from(KEYS))
    def send(self, destination: str, key: str | None) -> None:
        payload = {"n": len(self.rows)}
        message = django_outbox.send("prop.happened", payload, to=destination, key=key)
        stored = OutboxMessage.objects.get(pk=message.pk)
        if key is not None:
            earlier = [row.sequence or 0 for row in self.keys().get((destination, key), [])]
            assert stored.sequence is not None and stored.sequence > max(earlier, default=0)
        self.rows[stored.message_id] = Expected(
            pk=stored.pk,
            message_id=stored.message_id,
            destination=destination,
            key=key,
            sequence=stored.sequence,
            available_at=stored.available_at,
        )

    @initialize(
        messages=st.lists(
            st.tuples(st.sampled_from(DESTINATIONS), st.sampled_from(KEYS)), max_size=6
        )
    )
    def some_messages_wait(self, messages: list[tuple[str, str | None]]) -> None:
        for destination, key in messages:
            self.send(destination, key)

    @rule(
        outcomes=st.lists(st.sampled_from(OUTCOMES), max_size=12),
        later=st.sampled_from([0, 0, 30, 120]),
    )
    def run_batch(self, outcomes: list[str], later: int) -> None:
        """*later* seconds on, a relay claims what is due, publishes it with the scripted
        outcomes and records them."""
        self.now += timedelta(seconds=later)
        scripted.reset()
        waiting = sorted((r for r in self.rows.values() if r.state == READY), key=lambda r: r.pk)
        for row, outcome in zip(waiting, outcomes, strict=False):
            scripted.script[row.message_id] = outcome
        expected: list[Expected] = []
        for run in self.claimable():
            for row in run:
                expected.append(row)
                if scripted.script.get(row.message_id, "ok") != "ok":
                    break  # the rest of its key stays unattempted
        result = self.relay().run_batch()
        attempted = list(scripted.log)
        assert sorted(str(mid) for mid, _ in attempted) == sorted(
            str(row.message_id) for row in expected
        ), "the relay did not attempt exactly the due heads and the runs behind them"
        assert result.claimed >= len(expected)
        self.check_order(attempted)
        stored = {
            m.message_id: m
            for m in OutboxMessage.objects.filter(message_id__in=[mid for mid, _ in attempted])
        }
        for mid, outcome in attempted:
            row = self.rows[mid]
            row.attempts += 1
            if outcome == "ok":
                self.published_ok(row)
                self.done(row)
                continue
            self.failed(row, outcome)
            if row.state == READY:
                at = stored[mid].available_at
                assert self.now < at <= self.now + timedelta(seconds=RETRY_MAX_SECONDS + 1)
                row.available_at = at
        assert result.sent == sum(1 for _, outcome in attempted if outcome == "ok")

    @rule(with_worker=st.booleans(), published=st.integers(0, 4))
    def relay_dies_holding_a_batch(self, with_worker: bool, published: int) -> None:
        """A relay claims a batch and dies: without a heartbeat after publishing a few of
        it, with one before starting any (its starts were never declared)."""
        expected = {row.message_id for run in self.claimable() for row in run}
        with claims_carry(DEAD_WORKER if with_worker else None):
            rows, lease = self.relay().claim_batch()
        assert {row.message_id for row in rows} == expected
        stored = {m.pk: m for m in OutboxMessage.objects.filter(pk__in=[r.pk for r in rows])}
        for claimed in rows:
            row = self.rows[claimed.message_id]
            row.state, row.token = SENDING, lease.token
            row.worker = DEAD_WORKER if with_worker else None
            row.locked_until = stored[claimed.pk].locked_until
            row.crashed = True
        abandoned = Abandoned(rows, lease, self.now)
        if not with_worker:
            order = sorted(rows, key=_publish_order)[:published]
            went = [(row.message_id, "ok") for row in order]
            self.check_order(went)
            for mid, _ in went:
                self.published_ok(self.rows[mid])
                abandoned.published.add(mid)
        self.abandoned.append(abandoned)

    @rule(seconds=st.sampled_from([1, 10, 30, 59, 61, 90, 300]))
    def time_passes(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    def rescued(self, row: Expected) -> None:
        """The rescue of a stuck row: given back if its start was never declared, else its
        attempt counted and recorded as uncertain (resent now, or held)."""
        if row.worker is not None:
            row.state, row.token, row.worker, row.locked_until = READY, None, None, None
            return
        row.attempts += 1
        self.failed(row, "uncertain")
        if row.state == READY:
            row.available_at = self.now

    @rule()
    def sweep_expired_leases(self) -> None:
        stuck = [
            row
            for row in self.rows.values()
            if row.state == SENDING and row.locked_until is not None and row.locked_until < self.now
        ]
        result = rescue_stuck_messages(now=self.now)
        for row in stuck:
            self.rescued(row)
        assert result.total == len(stuck)

    @rule()
    def rescue_dead_worker(self) -> None:
        stuck = [
            row
            for row in self.rows.values()
            if row.state == SENDING
            and (row.worker == DEAD_WORKER or (row.locked_until or self.now) < self.now)
        ]
        result = sweeps.rescue_stuck(Publishing(), dead_workers=[DEAD_WORKER], at=self.now)
        for row in stuck:
            self.rescued(row)
        assert result.total == len(stuck)

    @precondition(lambda self: self.abandoned)
    @rule(
        data=st.data(),
        overtaken=st.sampled_from((None, "rescued", "resent")),
        more=st.booleans(),
    )
    def dead_relay_records_late(
        self, data: st.DataObject, overtaken: str | None, more: bool
    ) -> None:
        """The relay that claimed a batch was only slow. Meanwhile its lease may have run
        out and its rows been rescued (*overtaken*), and then sent by another relay
        (``resent``); with *more*, each key of its batch got one more message. It records
        what it published, and what the transport answered for the rows it went on to in
        publish order (any answer, a keyed head's failure too; a key stops at its first
        failure), and gives the rest back. Fenced: rows taken from it do not move, nor
        are their keys parked or freed."""
        batch = self.abandoned.pop(data.draw(st.integers(0, len(self.abandoned) - 1)))
        if overtaken is not None:
            self.now = max(self.now, batch.at + timedelta(seconds=LEASE_SECONDS + 1))
            self.sweep_expired_leases()
            if overtaken == "resent":
                self.run_batch(outcomes=[], later=0)
        if more:
            for destination, key in sorted({(r.destination, r.key) for r in batch.rows if r.key}):
                self.send(destination, key)
        held = {
            row.message_id
            for row in batch.rows
            if self.rows.get(row.message_id) is not None
            and self.rows[row.message_id].token == batch.lease.token
        }
        answers: dict[uuid.UUID, str] = {}
        stopped: set[tuple[str, str]] = set()
        for row in sorted(batch.rows, key=_publish_order):
            slot = (row.destination, row.key) if row.key is not None else None
            if row.message_id in batch.published:
                answer = "ok"
            elif slot in stopped:
                answer = "unreached"
            else:
                answer = data.draw(st.sampled_from(("unreached", *OUTCOMES)))
            if answer != "ok" and slot is not None:
                stopped.add(slot)
            answers[row.message_id] = answer
        # Its publishes went out while its lease ran, in order: check them as of then.
        went = [(mid, answer) for mid, answer in answers.items() if answer != "unreached"]
        self.check_order([(mid, answer) for mid, answer in went if mid in self.rows])
        for mid, answer in went:
            if answer == "ok" and mid not in batch.published and mid in self.rows:
                self.published_ok(self.rows[mid])
        relay = self.relay()
        attempted = [row for row in batch.rows if answers[row.message_id] != "unreached"]
        rest = [row for row in batch.rows if answers[row.message_id] == "unreached"]
        if attempted:
            for row in attempted:
                # Its attempt, counted with its outcome, as the relay notes it in hand.
                row.attempts, row.attempted_at = row.attempts + 1, batch.at
            outcomes: dict[Any, Outcome] = {
                row.pk: LATE[answers[row.message_id]] for row in attempted
            }
            result = relay.record(attempted, outcomes, batch.lease)
            sent = [row for row in attempted if answers[row.message_id] == "ok"]
            assert result.sent == len([row for row in sent if row.message_id in held])
        if rest:
            released = relay.release(rest, batch.lease)
            assert released == len([row for row in rest if row.message_id in held])
        stored = {m.message_id: m for m in OutboxMessage.objects.filter(message_id__in=held)}
        for mid in held:
            row, answer = self.rows[mid], answers[mid]
            if answer == "unreached":
                row.state, row.token, row.worker, row.locked_until = READY, None, None, None
                continue
            row.attempts += 1
            if answer == "ok":
                self.done(row)
                continue
            self.failed(row, answer)
            if row.state == READY:
                at = stored[mid].available_at
                assert self.now < at <= self.now + timedelta(seconds=RETRY_MAX_SECONDS + 1)
                row.available_at = at

    @rule(data=st.data())
    def operator_requeues(self, data: st.DataObject) -> None:
        chosen = data.draw(st.sets(st.sampled_from(sorted(self.by_pk()) or [0]), max_size=3))
        moved = OutboxMessage.objects.filter(pk__in=chosen).requeue(now=self.now)
        expected = [row for pk, row in self.by_pk().items() if pk in chosen and row.state == ERROR]
        assert moved == len(expected)
        for row in expected:
            row.state, row.attempts, row.uncertain, row.available_at = READY, 0, False, self.now

    @rule(data=st.data())
    def operator_cancels(self, data: st.DataObject) -> None:
        chosen = data.draw(st.sets(st.sampled_from(sorted(self.by_pk()) or [0]), max_size=3))
        moved = OutboxMessage.objects.filter(pk__in=chosen).cancel(now=self.now)
        expected = [
            row for pk, row in self.by_pk().items() if pk in chosen and row.state in (READY, ERROR)
        ]
        assert moved == len(expected)
        for row in expected:
            row.state, row.finished_at, row.blocking = CANCELLED, self.now, False

    @rule()
    def purge(self) -> None:
        deleted = purge_finished_messages(now=self.now, older_than=timedelta(0))
        expired = {
            mid
            for mid, row in self.rows.items()
            if row.state in FINISHED and row.finished_at is not None and row.finished_at < self.now
        }
        if partitions.is_partitioned(OutboxMessage, "default"):
            # Rows go with their partition, up to an interval after they expired (make
            # test-partitioned): an expired row may stay, no other row may go.
            stored = set(OutboxMessage.objects.values_list("message_id", flat=True))
            gone = {mid for mid in self.rows if mid not in stored}
            assert gone <= expired, gone - expired
        else:
            gone = expired
            assert deleted == len(gone)
        for mid in gone:
            del self.rows[mid]

    # -- invariants -----------------------------------------------------------------

    @invariant()
    def table_agrees_with_the_model(self) -> None:
        stored = list(OutboxMessage.objects.order_by("pk"))
        ids = [m.message_id for m in stored]
        assert len(ids) == len(set(ids)), "a message is stored twice"
        assert set(ids) == set(self.rows), "a message was lost or appeared"
        for m in stored:
            row = self.rows[m.message_id]
            seen = (m.state, m.attempts, m.uncertain, m.blocking)
            assert seen == (row.state, row.attempts, row.uncertain, row.blocking), (m.pk, seen, row)
            assert m.attempts <= MAX_ATTEMPTS
            if m.state == SENDING:
                assert m.lock_token == row.token and m.locked_until is not None
                assert m.claimed_by == row.worker
            else:
                assert not m.attempt_open, m.pk
                if m.state != SENT:  # a sent row keeps the token of the claim that sent it
                    assert m.lock_token is None and m.locked_until is None, m.pk
            if m.state in FINISHED:
                assert m.finished_at == row.finished_at and not m.blocking, m.pk
            if m.state == SENT:
                assert m.sent_at == m.finished_at
            if m.state == READY:
                assert m.available_at == row.available_at, m.pk
            if m.blocked:
                # Parked while ready or claimed; a parked message whose own attempt then
                # fails for good keeps the mark (it waits for an operator either way).
                assert m.state in UNFINISHED and m.key is not None, m.pk

    @invariant()
    def no_key_is_wedged(self) -> None:
        """The first unfinished message of a key is never parked; a message is parked only
        behind an earlier unfinished one of its key that failed (else it waits for ever:
        nothing will free it), never behind a head another relay sent or one a writer
        fenced out said failed; a key with parked messages is marked parked, and a key
        marked parked has a failed message holding it back (else new messages would
        park for ever); and every waiting message after a failed one of its key is
        parked (else it would be sent ahead of it), unless it holds its key itself."""
        stored = list(OutboxMessage.objects.exclude(key=None).order_by("sequence"))
        heads: dict[tuple[str, str], OutboxMessage] = {}
        holding: set[tuple[str, str]] = set()
        parked: set[tuple[str, str]] = set()
        for m in stored:
            assert m.key is not None
            slot = (m.destination, m.key)
            if slot in holding and m.state in (READY, SENDING) and not m.blocking:
                # (One that holds its key itself, an uncertain one a rescue retries, waits
                # its turn in the claim's key order instead.)
                assert m.blocked, f"{slot} seq {m.sequence} ({m.state}) runs ahead of a failed one"
            if m.blocked:
                assert slot in holding, (
                    f"{slot} seq {m.sequence} ({m.state}) parked behind no failed message"
                )
                parked.add(slot)
            if m.state in UNFINISHED:
                heads.setdefault(slot, m)
                if m.blocking or m.state == ERROR:
                    holding.add(slot)
        for slot, head in heads.items():
            assert not (head.state == READY and head.blocked), f"{slot} wedged behind nothing"
        marked = {(c.destination, c.key) for c in OutboxKey.objects.filter(blocked=True)}
        for slot in marked:
            assert slot in holding, f"key {slot} parked with nothing holding it back"
        for slot in parked:
            assert slot in marked, f"key {slot} has parked messages but is not marked parked"


# A failing run spends up to Hypothesis's five minutes shrinking: let it finish and report
# the shortest example, not be cut off mid-shrink by the suite's 300 s timeout.
@pytest.mark.timeout(600)
def test_the_outbox_state_machine(settings: Any) -> None:
    settings.DJANGO_OUTBOX = json.loads(json.dumps(SETTINGS))
    run_state_machine_as_test(OutboxMachine)
