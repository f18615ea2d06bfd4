"""The relay overlaps RabbitMQ's publisher confirms with its next batches: batches
N+1 to N+k (k is ``Runner.waiting_batches``) are handed over before the relay waits for
batch N's confirms and records its outcomes. While N waits, its started rows are marked
started in the database (``attempt_open``): the next batch's declaration takes N's place
on the worker's row, and a crash must still count N's attempts (the kill-point test
proves that with a real SIGKILL)."""

import pytest

import django_outbox
from django_outbox.engine import heartbeat
from django_outbox.engine.runner import Runner
from django_outbox.models import OutboxMessage, OutboxState
from django_outbox.outbox.relay import Relay
from django_outbox.outbox.transports.kombu import KombuTransport
from tests.integration.test_kombu_transport import drain_queue

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.rabbitmq,
    pytest.mark.row_locks,
]


@pytest.fixture
def rabbit(configure_outbox, amqp_url, queue_name):
    configure_outbox(
        DESTINATIONS={"default": {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": queue_name}}
    )
    return amqp_url, queue_name


@pytest.fixture
def journal(monkeypatch):
    """What the relay did, in order: ("hand over", ids, the unrecorded batches' rows as
    the database had them then, how many batches those were) and ("record", ids)."""
    events = []
    handed = []
    hand_over, record = KombuTransport.hand_over, Runner.record

    def spy_hand_over(self, envelopes, deadline=None):
        recorded = {i for event in events if event[0] == "record" for i in event[1]}
        waiting = [batch for batch in handed if set(batch) - recorded]
        rows = OutboxMessage.objects.filter(message_id__in=[i for b in waiting for i in b])
        seen = {r.message_id: (r.state, r.attempt_open) for r in rows}
        ids = [e.message_id for e in envelopes]
        handed.append(ids)
        events.append(("hand over", ids, seen, len(waiting)))
        return hand_over(self, envelopes, deadline)

    def spy_record(self, rows, outcomes, lease):
        events.append(("record", [row.message_id for row in rows]))
        return record(self, rows, outcomes, lease)

    monkeypatch.setattr(KombuTransport, "hand_over", spy_hand_over)
    monkeypatch.setattr(Runner, "record", spy_record)
    return events


def test_the_next_batch_goes_out_before_this_one_is_recorded(rabbit, journal):
    url, queue = rabbit
    sent = [django_outbox.send("t", {"n": n}).message_id for n in range(60)]
    heartbeat.start("relay")  # a worker declares its starts, as outbox_relay does

    assert Relay(batch_size=10).drain().sent == 60

    received = drain_queue(url, queue)
    assert sorted(m.headers["outbox-message-id"] for m in received) == sorted(map(str, sent))
    rows = OutboxMessage.objects.all()
    assert {(r.state, r.attempts, r.attempt_open) for r in rows} == {(OutboxState.SENT, 1, False)}
    overlapped = [event for event in journal if event[0] == "hand over" and event[2]]
    assert overlapped, journal  # some batch was handed over while an earlier one waited
    for _, ids, waiting, _ in overlapped:
        # The batch that waits for its confirms is marked started, still held.
        assert set(waiting.values()) == {(OutboxState.SENDING, True)}, waiting
        assert not set(ids) & set(waiting)


def test_batches_are_recorded_in_the_order_they_were_handed_over(rabbit, journal):
    for n in range(40):
        django_outbox.send("t", {"n": n})
    heartbeat.start("relay")

    assert Relay(batch_size=10).drain().sent == 40

    handed = [event[1] for event in journal if event[0] == "hand over"]
    recorded = [event[1] for event in journal if event[0] == "record"]
    assert recorded == handed


@pytest.mark.parametrize("limit", [0, 1, 3])
def test_as_many_batches_wait_for_their_confirms_as_the_relay_allows(rabbit, journal, limit):
    url, queue = rabbit
    sent = [django_outbox.send("t", {"n": n}).message_id for n in range(80)]
    heartbeat.start("relay")
    relay = Relay(batch_size=10)
    relay.waiting_batches = limit

    assert relay.drain().sent == 80

    waiting = [event[3] for event in journal if event[0] == "hand over"]
    # The drain runs its first batch alone (an idle poll costs one claim, no thread),
    # then overlaps the rest.
    assert waiting == [0] + [min(n, limit) for n in range(7)]
    assert len(drain_queue(url, queue)) == len(sent)


def test_a_keyed_message_never_goes_out_while_an_earlier_one_of_its_key_waits(rabbit, journal):
    url, queue = rabbit
    sent = [django_outbox.send("t", {"n": n}, key=f"k{n % 3}") for n in range(60)]
    heartbeat.start("relay")

    assert Relay(batch_size=10).drain().sent == 60

    for _, ids, waiting, _ in (event for event in journal if event[0] == "hand over"):
        keys_waiting = {m.key for m in sent if m.message_id in waiting}
        assert not keys_waiting & {m.key for m in sent if m.message_id in ids}
    received = [m.headers["outbox-message-id"] for m in drain_queue(url, queue)]
    for key in ("k0", "k1", "k2"):
        in_key = [str(m.message_id) for m in sent if m.key == key]
        assert [i for i in received if i in in_key] == in_key


def test_answers_lost_with_two_batches_in_flight_leave_nothing_stuck_or_lost(
    configure_outbox, amqp_url, queue_name, monkeypatch
):
    """RabbitMQ's confirms stop arriving (a TCP proxy swallows them) just as a third
    batch is handed over while earlier ones wait: every message handed over without a
    confirm is uncertain and held, the rest are sent or wait uncounted, no row stays
    `sending` or marked, and once the broker answers again everything goes out."""
    from django_outbox.outbox.circuits import circuits
    from tests import services
    from tests.proxy import TcpProxy

    proxy = TcpProxy(services.SERVICES["rabbitmq"])
    proxy.up()
    try:
        configure_outbox(
            DESTINATIONS={
                "default": {
                    "TRANSPORT": "kombu",
                    "URL": f"amqp://guest:guest@127.0.0.1:{proxy.port}//",
                    "QUEUE": queue_name,
                    "UNCERTAIN": "hold",
                    "TIMEOUT": 1.0,
                }
            }
        )
        sent = [django_outbox.send("t", {"n": n}).message_id for n in range(60)]
        hand_over = KombuTransport.hand_over
        calls = []

        def cut_on_the_third(self, envelopes, deadline=None):
            calls.append([e.message_id for e in envelopes])
            if len(calls) == 3:
                proxy.mode = "swallow_replies"
            return hand_over(self, envelopes, deadline)

        monkeypatch.setattr(KombuTransport, "hand_over", cut_on_the_third)
        heartbeat.start("relay")

        Relay(batch_size=10).drain()

        rows = {r.message_id: r for r in OutboxMessage.objects.all()}
        assert not [r for r in rows.values() if r.state == OutboxState.SENDING]
        assert not [r for r in rows.values() if r.attempt_open]
        held = {i for i, r in rows.items() if r.state == OutboxState.SEND_ERROR}
        assert all(rows[i].uncertain for i in held)
        assert set(calls[2]) <= held  # handed over, never confirmed
        # Only what was in flight: the batches handed over and unconfirmed when the
        # collect that timed out began (a run of at most waiting_batches + 1, the cut
        # one among them); the timeout fails them all.
        spans = [k for k, ids in enumerate(calls) if set(ids) & held]
        assert 2 in spans, spans
        assert spans == list(range(spans[0], spans[-1] + 1)), spans
        assert len(spans) <= Runner.waiting_batches + 1, spans
        waiting = {i for i, r in rows.items() if r.state == OutboxState.SHOULD_BE_SENT}
        assert all(rows[i].attempts == 0 for i in waiting)

        # The broker answers again: what waited goes out, the held stay held.
        proxy.mode = "forward"
        circuits.reset()
        monkeypatch.setattr(KombuTransport, "hand_over", hand_over)
        Relay(batch_size=10).drain()
        states = dict(OutboxMessage.objects.values_list("message_id", "state"))
        assert {states[i] for i in held} == {OutboxState.SEND_ERROR}
        assert {states[i] for i in set(sent) - held} == {OutboxState.SENT}
        at_broker = [m.headers["outbox-message-id"] for m in drain_queue(amqp_url, queue_name)]
        # The swallowed answers were the broker's: the held messages did arrive, once.
        assert sorted(at_broker) == sorted(map(str, sent))
    finally:
        proxy.down()
