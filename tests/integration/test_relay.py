"""The relay: claim, publish, record with fencing, backoff, dead-letter, ordering."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

import django_outbox
from django_outbox.models import OutboxMessage, OutboxState
from django_outbox.outbox.maintenance import rescue_stuck_messages
from django_outbox.outbox.relay import Relay
from django_outbox.outbox.transports.memory import mailbox
from django_outbox.signals import outbox_batch_published
from tests.factories import leave_sending

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPTED = {"TRANSPORT": "tests.support.ScriptedTransport"}


@pytest.fixture
def scripted(configure_outbox):
    return configure_outbox(
        DESTINATIONS={"default": SCRIPTED, "held": {**SCRIPTED, "UNCERTAIN": "hold"}}
    )


class Clock:
    def __init__(self):
        self.now = timezone.now()

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += timedelta(seconds=seconds)


def published(destination="default"):
    return [(e.type, e.key, e.sequence) for e in mailbox[destination]]


def test_due_messages_are_published_with_headers_and_marked_sent():
    with transaction.atomic():
        message = django_outbox.send("order.created", {"id": 1}, key="order:1")
    result = Relay().drain()
    assert result.sent == 1
    message.refresh_from_db()
    assert message.state == OutboxState.SENT
    assert message.sent_at is not None
    assert message.finished_at == message.sent_at
    # The lease is over; the token stays on the finished row: which claim finished it.
    assert message.locked_until is None and message.lock_token is not None
    [envelope] = mailbox["default"]
    assert envelope.headers["outbox-message-id"] == str(message.message_id)
    assert envelope.headers["outbox-sequence"] == "1"


def test_messages_not_yet_available_wait():
    message = django_outbox.send("t", {})
    OutboxMessage.objects.filter(pk=message.pk).update(
        available_at=timezone.now() + timedelta(hours=1)
    )
    assert Relay().drain().claimed == 0
    assert mailbox["default"] == []


def test_retryable_failure_backs_off_exponentially_then_dead_letters(scripted):
    message = django_outbox.send("fail.retry", {})
    clock = Clock()
    relay = Relay(clock=clock)
    windows = []
    for attempt in range(1, 5):
        relay.drain()
        message.refresh_from_db()
        assert message.state == OutboxState.SHOULD_BE_SENT
        assert message.attempts == attempt
        assert message.last_error == "broker said try later"
        windows.append((message.available_at - clock.now).total_seconds())
        clock.now = message.available_at
    # Base 1 s, equal jitter: attempt n waits within [2**(n-1)/2, 2**(n-1)] seconds.
    for n, wait in enumerate(windows, start=1):
        assert 2 ** (n - 1) / 2 <= wait <= 2 ** (n - 1)
    relay.drain()  # fifth attempt: MAX_ATTEMPTS is 5
    message.refresh_from_db()
    assert message.state == OutboxState.SEND_ERROR
    assert message.last_error == "gave up after 5 attempts: broker said try later"


def test_permanent_failure_dead_letters_at_once(scripted):
    message = django_outbox.send("fail.permanent", {})
    result = Relay().drain()
    message.refresh_from_db()
    assert (result.failed, message.state, message.attempts) == (1, OutboxState.SEND_ERROR, 1)
    assert message.last_error == "422 unprocessable"


def test_a_relay_that_does_not_know_the_destination_retries_it(configure_outbox):
    # A rolling deploy: a newer process sent to "held", this older relay does
    # not know it yet. The message waits for a relay that does.
    message = django_outbox.send("t", {}, to="held")
    configure_outbox(DESTINATIONS={"default": {"TRANSPORT": "memory"}})
    Relay().drain()
    message.refresh_from_db()
    assert (message.state, message.attempts) == (OutboxState.SHOULD_BE_SENT, 1)
    assert "unknown outbox destination 'held'" in message.last_error


def test_a_failing_message_holds_back_only_its_own_key(scripted):
    django_outbox.send("a", {"fail": "retry"}, key="k")
    django_outbox.send("b", {}, key="k")
    django_outbox.send("c", {}, key="k")
    django_outbox.send("x", {}, key="other")
    django_outbox.send("y", {})
    clock = Clock()
    relay = Relay(clock=clock)
    relay.drain()
    assert sorted(published(), key=str) == [("x", "other", 1), ("y", None, None)]
    assert set(OutboxMessage.objects.filter(key="k").values_list("state", flat=True)) == {
        OutboxState.SHOULD_BE_SENT
    }
    # The failing head now succeeds: its key drains in sequence order.
    OutboxMessage.objects.filter(type="a").update(payload={})
    clock.advance(60)
    relay.drain()
    assert published()[2:] == [("a", "k", 1), ("b", "k", 2), ("c", "k", 3)]


def test_failure_mid_batch_releases_the_rest_of_the_key_unattempted(scripted):
    django_outbox.send("a", {}, key="k")
    django_outbox.send("b", {"fail": "retry"}, key="k")
    django_outbox.send("c", {}, key="k")
    result = Relay().run_batch()
    assert result.claimed == 3
    assert (result.sent, result.retried, result.released) == (1, 1, 1)
    c = OutboxMessage.objects.get(type="c")
    assert (c.state, c.attempts) == (OutboxState.SHOULD_BE_SENT, 0)
    assert published() == [("a", "k", 1)]


def test_a_relay_whose_lease_was_taken_over_cannot_overwrite_the_newer_outcome():
    message = django_outbox.send("t", {})
    later = Clock()
    later.advance(3600)

    def take_over(**kwargs):
        # The first relay stalls after publishing; its lease expires, the sweep
        # resends and a second relay records a newer outcome.
        outbox_batch_published.disconnect(take_over)
        rescue_stuck_messages(now=later.now)
        assert Relay(clock=later).drain().sent == 1

    outbox_batch_published.connect(take_over)
    try:
        stale = Relay().run_batch()
    finally:
        outbox_batch_published.disconnect(take_over)
    assert stale.fenced == 1 and stale.sent == 0  # the outcome it published is not its own
    message.refresh_from_db()
    assert message.state == OutboxState.SENT
    assert message.sent_at == later.now
    assert message.attempts == 2


def test_deliver_exits_at_once_when_its_ids_are_already_taken():
    first = django_outbox.send("t", {})
    Relay().drain()
    django_outbox.send("t2", {})  # due, but not this trigger's
    result = Relay().deliver([first.pk])
    assert result.claimed == 0
    assert len(mailbox["default"]) == 1


def test_deliver_claims_its_ids_then_drains_the_rest():
    first = django_outbox.send("t", {})
    django_outbox.send("t2", {})
    result = Relay().deliver([first.pk])
    assert result.sent == 2


def test_batch_query_count_does_not_grow_with_batch_size(django_assert_max_num_queries):
    for n in range(150):
        django_outbox.send("t", {"n": n}, key=f"k{n % 3}")
    counts = []
    for size in (10, 100):
        relay = Relay(batch_size=size)
        with django_assert_max_num_queries(12) as captured:
            assert relay.run_batch().sent == size
        counts.append(len(captured.captured_queries))
    assert counts[0] == counts[1]


@pytest.mark.parametrize(
    ("destination", "state", "uncertain"),
    [("default", OutboxState.SHOULD_BE_SENT, False), ("held", OutboxState.SEND_ERROR, True)],
)
def test_expired_lease_is_resent_or_held_per_destination_policy(destination, state, uncertain):
    message = django_outbox.send("t", {}, to=destination)
    leave_sending(message, lease_ends_in=-1, attempts=1)
    result = rescue_stuck_messages()
    message.refresh_from_db()
    assert (message.state, message.uncertain) == (state, uncertain)
    assert message.lock_token is None
    assert "outcome uncertain" in message.last_error
    assert (result.resent, result.held) == (
        (1, 0) if state == OutboxState.SHOULD_BE_SENT else (0, 1)
    )


def test_unexpired_leases_are_left_alone():
    message = django_outbox.send("t", {})
    leave_sending(message, lease_ends_in=30)
    assert rescue_stuck_messages().resent == 0


def test_expired_lease_with_attempts_used_up_is_held_even_under_resend():
    message = django_outbox.send("t", {})
    leave_sending(message, lease_ends_in=-1, attempts=5)
    rescue_stuck_messages()
    message.refresh_from_db()
    assert (message.state, message.uncertain) == (OutboxState.SEND_ERROR, True)


@pytest.mark.row_locks
def test_prefetching_drain_releases_claimed_batches_when_publishing_fails():
    for n in range(40):
        django_outbox.send("t", {"n": n})
    relay = Relay(batch_size=10)
    record = relay.record
    calls = []

    def fail_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("database went away while recording")
        return record(*args, **kwargs)

    relay.record = fail_second
    with pytest.raises(RuntimeError, match="went away"):
        relay.drain()
    rows = list(OutboxMessage.objects.all())
    sent = [r for r in rows if r.state == OutboxState.SENT]
    in_flight = [r for r in rows if r.state == OutboxState.SENDING]
    waiting = [r for r in rows if r.state == OutboxState.SHOULD_BE_SENT]
    # Batch 1 went out and was recorded; batch 2 failed while recording and
    # stays leased (the sweep rescues it); whatever the claimer had prefetched
    # went straight back, its attempt uncounted.
    assert (len(sent), len(in_flight), len(waiting)) == (10, 10, 20)
    assert {r.attempts for r in waiting} == {0}
    assert Relay(batch_size=10).drain().sent == 20


@pytest.mark.row_locks
def test_prefetching_drain_delivers_long_keys_past_the_batch_size_in_order():
    for n in range(35):
        django_outbox.send("t", {"n": n}, key="k")
    assert Relay(batch_size=10).drain().sent == 35
    assert [e.sequence for e in mailbox["default"]] == list(range(1, 36))


def test_a_transport_that_cannot_be_built_leaves_messages_retrying(configure_outbox):
    configure_outbox(
        DESTINATIONS={
            "default": {
                "TRANSPORT": "kombu",
                "URL": "redis://127.0.0.1:6379/0",
                "QUEUE": "q",
                "TIMEOUT": "not-a-number",
            }
        }
    )
    message = django_outbox.send("t", {})
    result = Relay().drain()
    message.refresh_from_db()
    assert (result.retried, message.state) == (1, OutboxState.SHOULD_BE_SENT)
    assert message.last_error.startswith("transport unavailable: ValueError")


def test_a_batch_stops_starting_messages_when_its_lease_runs_short(configure_outbox):
    configure_outbox(
        DESTINATIONS={"default": {"TRANSPORT": "tests.support.SlowTransport", "DELAY": 0.3}},
        LEASE_SECONDS=1.0,
    )
    for n in range(10):
        django_outbox.send("t", {"n": n})
    result = Relay().run_batch()
    # 0.8 s of the 1 s lease may be used: a few messages, never all ten.
    assert 1 <= result.sent <= 4
    assert result.released == 10 - result.sent
    assert OutboxMessage.objects.filter(state=OutboxState.SHOULD_BE_SENT, attempts=0).count() == (
        10 - result.sent
    )


@pytest.mark.row_locks
def test_a_follower_locked_by_someone_else_cuts_the_run_and_is_not_jumped():
    import threading

    from django.db import connections

    messages = [django_outbox.send("t", {"n": n}, key="k") for n in range(6)]
    locked, release = threading.Event(), threading.Event()

    def hold_lock_on_third():
        # Another claimer's scan holding a row lock for a moment (InnoDB locks
        # rows a locking read scans; here we take it explicitly).
        with transaction.atomic():
            list(OutboxMessage.objects.select_for_update().filter(pk=messages[2].pk))
            locked.set()
            release.wait(10)
        connections.close_all()

    holder = threading.Thread(target=hold_lock_on_third)
    holder.start()
    try:
        assert locked.wait(10)
        first = Relay(batch_size=10).run_batch()
    finally:
        release.set()
        holder.join()
    assert [e.sequence for e in mailbox["default"]] == [1, 2]
    assert first.sent == 2
    assert Relay(batch_size=10).drain().sent == 4
    assert [e.sequence for e in mailbox["default"]] == [1, 2, 3, 4, 5, 6]


def test_a_raising_signal_receiver_does_not_cost_the_batch_its_outcome(caplog):
    message = django_outbox.send("t", {})

    def broken_tracer(**kwargs):
        raise RuntimeError("tracing backend down")

    outbox_batch_published.connect(broken_tracer)
    try:
        assert Relay().drain().sent == 1
    finally:
        outbox_batch_published.disconnect(broken_tracer)
    message.refresh_from_db()
    assert message.state == OutboxState.SENT
    assert "raised" in caplog.text and "tracing backend down" in caplog.text


@pytest.mark.postgres
def test_ten_thousand_failures_in_one_batch_are_recorded_in_bounded_statements(configure_outbox):
    # About eight parameters a failed row: one UPDATE for them all would pass
    # PostgreSQL's 65,535-parameter limit and fail on every try.
    configure_outbox(DESTINATIONS={"default": SCRIPTED}, BATCH_SIZE=10_000)
    OutboxMessage.objects.bulk_create(
        OutboxMessage(type="fail.retry", destination="default", payload={"n": n})
        for n in range(10_000)
    )
    result = Relay().run_batch()
    assert (result.claimed, result.retried) == (10_000, 10_000)
    assert set(OutboxMessage.objects.values_list("state", "attempts")) == {
        (OutboxState.SHOULD_BE_SENT, 1)
    }
