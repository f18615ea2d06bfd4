"""inbox_consume's AMQP transport (``inbox.consumers.amqp``): frames read from the socket
in large pieces, against a real RabbitMQ and a real socket; nothing lost, reordered or
held back, and a read cut short in the middle of a frame resumes where it stopped."""

from __future__ import annotations

import socket
import struct

import kombu
import pytest

from django_outbox.conf import Source
from django_outbox.inbox.consumers import amqp
from django_outbox.inbox.consumers.kombu import KombuConsumer
from django_outbox.models import InboxMessage, InboxState

pytestmark = pytest.mark.rabbitmq


def frame(payload: bytes, *, kind: int = 3, channel: int = 1) -> bytes:
    """An AMQP frame: type, channel, size, payload, the end octet."""
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce"


@pytest.fixture
def transport():
    """A BufferedTCPTransport over one end of a socket pair; the other end is the
    'broker'."""
    ours, theirs = socket.socketpair()
    made = amqp.BufferedTCPTransport("127.0.0.1:5672")
    made.sock = ours
    made._setup_transport()
    made.connected = True
    yield made, theirs
    ours.close()
    theirs.close()


def test_frames_that_came_in_one_piece_are_handed_out_one_by_one(transport):
    made, broker = transport
    payloads = [b"a" * 10, b"", b"b" * (amqp.READ_SIZE + 5), b"c"]
    broker.sendall(b"".join(frame(p) for p in payloads))
    received = []
    for _ in payloads:
        kind, channel, payload = made.read_frame()
        received.append(bytes(payload))
        assert (kind, channel) == (3, 1)
    assert received == payloads
    assert made._read_buffer == b""


def test_a_read_that_times_out_mid_frame_resumes_from_the_frames_first_byte(transport):
    made, broker = transport
    whole = frame(b"x" * 300) + frame(b"next")
    broker.sendall(whole[:100])  # the header and part of the payload
    made.sock.settimeout(0.2)
    with pytest.raises(socket.timeout):
        made.read_frame()
    # What came is held, not lost: the frame's bytes are readable again.
    assert made._read_buffer == whole[:100]
    broker.sendall(whole[100:])
    assert bytes(made.read_frame()[2]) == b"x" * 300
    assert bytes(made.read_frame()[2]) == b"next"


def test_the_socket_timeout_is_left_alone_while_a_whole_frame_is_held(transport):
    made, broker = transport
    made.sock.settimeout(30.0)
    broker.sendall(frame(b"one") + frame(b"two")[:6])
    with made.having_timeout(0.5) as sock:  # nothing held yet: the socket will wait
        assert sock.gettimeout() == 0.5
        assert bytes(made.read_frame()[2]) == b"one"
    assert made.sock.gettimeout() == 30.0
    broker.sendall(frame(b"two")[6:] + frame(b"three"))
    with made.having_timeout(0.5) as sock:  # "two" is partly held: it will wait
        assert sock.gettimeout() == 0.5
        assert bytes(made.read_frame()[2]) == b"two"
    with made.having_timeout(0.5) as sock:  # "three" is held whole: no wait
        assert sock.gettimeout() == 30.0
        assert bytes(made.read_frame()[2]) == b"three"


def test_a_closed_connection_is_an_error_not_an_empty_frame(transport):
    made, broker = transport
    broker.sendall(frame(b"cut")[:5])
    broker.close()
    with pytest.raises(OSError, match="closed"):
        made.read_frame()


@pytest.mark.parametrize(
    ("url", "buffered"),
    [
        ("amqp://guest:guest@127.0.0.1:5672//", True),
        ("pyamqp://127.0.0.1//", True),
        ("amqp://h1//;amqp://h2//", True),
        ("amqps://127.0.0.1//", False),
        ("amqp://h1//;amqps://h2//", False),
        ("redis://127.0.0.1:6379/0", False),
        ("memory://", False),
    ],
)
def test_only_plain_amqp_urls_get_the_buffered_transport(url, buffered):
    assert (amqp.buffered_transport(url) is amqp.Transport) is buffered


def test_a_queue_of_many_sizes_arrives_whole_in_order_in_few_reads(amqp_url, queue_name):
    """Through kombu and RabbitMQ: bodies from two bytes to several frames long (RabbitMQ's
    frames are at most 128 KiB) come intact, in order, and the socket is read far
    fewer times than py-amqp's three reads a frame."""
    bodies = [b"[]", b"{}", *(b'{"n": %d}' % n for n in range(300)), b"z" * 300_000, b"y" * 20]
    with kombu.Connection(amqp_url) as publisher:
        producer = publisher.Producer()
        queue = kombu.Queue(queue_name, durable=True)
        for body in bodies:
            producer.publish(
                body, routing_key=queue_name, declare=[queue], content_type="application/json"
            )
    got = []
    reads = 0
    with kombu.Connection(amqp_url, transport=amqp.buffered_transport(amqp_url)) as conn:
        conn.connect()
        transport = conn.connection.transport
        assert isinstance(transport, amqp.BufferedTCPTransport)
        plain_recv = transport._quick_recv

        def counted_recv(size):
            nonlocal reads
            reads += 1
            return plain_recv(size)

        transport._quick_recv = counted_recv
        with conn.Consumer(
            [kombu.Queue(queue_name, durable=True)],
            on_message=lambda message: (got.append(message.body), message.ack()),
            prefetch_count=1000,
        ):
            while len(got) < len(bodies):
                conn.drain_events(timeout=5)
    assert got == bodies
    assert reads < len(bodies)


@pytest.mark.django_db(transaction=True)
def test_inbox_consume_reads_rabbitmq_through_it(amqp_url, queue_name, configure_outbox):
    configure_outbox(
        INBOX={"SOURCES": {"s": {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": queue_name}}}
    )
    with kombu.Connection(amqp_url) as publisher:
        producer = publisher.Producer()
        for n in range(50):
            producer.publish(
                b'{"n": %d}' % n,
                routing_key=queue_name,
                declare=[kombu.Queue(queue_name, durable=True)],
                content_type="application/json",
                headers={"outbox-message-id": f"m{n}", "outbox-type": "test.unhandled"},
            )
    source = Source(name="s", transport="kombu", options={"url": amqp_url, "queue": queue_name})
    consumer = KombuConsumer(source, handle=False)
    connection = consumer._connection()
    assert connection.transport_cls is amqp.Transport
    connection.release()
    consumer.run(until_idle=1)
    assert consumer.result.stored == 50
    stored = InboxMessage.objects.filter(source="s", state=InboxState.SHOULD_BE_HANDLED)
    assert sorted(stored.values_list("payload__n", flat=True)) == list(range(50))
