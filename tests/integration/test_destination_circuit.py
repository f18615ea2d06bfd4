"""A real HTTP endpoint that refuses connections, then comes back: the destination's
circuit, not each message, takes the outage."""

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

import django_outbox
from django_outbox.models import OutboxMessage, OutboxState
from django_outbox.outbox.circuits import CircuitState, circuits
from django_outbox.outbox.relay import Relay
from django_outbox.outbox.transports import memory

pytestmark = pytest.mark.django_db(transaction=True)


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        name = self.path.strip("/")
        if name == "drop":  # the server dies mid-request: no answer at all
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        status = int(name.removeprefix("status-")) if name.startswith("status-") else 200
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class Endpoint:
    """An HTTP endpoint on a fixed port that can be stopped (connections refused) and
    started again."""

    def __init__(self):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.httpd = None

    def start(self):
        ThreadingHTTPServer.allow_reuse_address = True
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None


@pytest.fixture
def endpoint(configure_outbox):
    endpoint = Endpoint()
    configure_outbox(
        DESTINATIONS={
            "hooks": {
                "TRANSPORT": "http",
                "URL": f"http://127.0.0.1:{endpoint.port}/{{type}}",
                "SECRET": "s",
                "TIMEOUT": 2,
            },
            "other": {"TRANSPORT": "memory"},
        }
    )
    yield endpoint
    endpoint.stop()


def states(destination):
    rows = OutboxMessage.objects.filter(destination=destination)
    return sorted({(r.state, r.attempts) for r in rows})


def test_an_endpoint_that_refuses_costs_no_attempts_and_its_backlog_goes_when_it_returns(
    endpoint,
):
    # Given an endpoint that refuses connections, and another destination that works
    for n in range(50):
        django_outbox.send("ok", {"n": n}, to="hooks", key=f"k{n % 5}")
    for n in range(5):
        django_outbox.send("ok", {"n": n}, to="other")

    # When the relay runs through the outage
    first = Relay().drain()
    during = [Relay().drain() for _ in range(3)]

    # Then the other destination is unaffected, and the endpoint's messages wait uncounted
    assert first.sent == 5 and len(memory.mailbox["other"]) == 5
    assert states("hooks") == [(OutboxState.SHOULD_BE_SENT, 0)]
    assert circuits.state("hooks") is CircuitState.OPEN
    assert sum(r.claimed for r in during) == 0  # nobody hammers a dead endpoint
    assert all(
        m.available_at <= timezone.now() for m in OutboxMessage.objects.filter(destination="hooks")
    )
    # Other destinations keep flowing while the circuit is open.
    django_outbox.send("ok", {"n": 99}, to="other")
    assert Relay().drain().sent == 1

    # When the endpoint comes back, everything goes at the first probe, in one drain
    endpoint.start()
    time.sleep(0.3)
    started = time.monotonic()
    result = Relay().drain()
    took = time.monotonic() - started
    assert result.sent == 50
    assert states("hooks") == [(OutboxState.SENT, 1)]
    assert circuits.state("hooks") is CircuitState.CLOSED
    assert took < 5


def test_a_long_outage_probes_less_and_less_often_but_at_most_every_cap(endpoint):
    django_outbox.send("ok", {}, to="hooks")
    claims = 0
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        claims += Relay().drain().claimed
        time.sleep(0.02)
    # Probes after 0.25, 0.5, 1, 2 s (cumulative 0.25, 0.75, 1.75, 3.75): the opening
    # attempt and three probes in 3 s, not one attempt per poll.
    assert 3 <= claims <= 5
    message = OutboxMessage.objects.get()
    assert (message.state, message.attempts) == (OutboxState.SHOULD_BE_SENT, 0)


def test_a_4xx_and_a_5xx_are_the_messages_not_the_destinations(endpoint):
    endpoint.start()
    rejected = django_outbox.send("status-422", {}, to="hooks")
    busy = django_outbox.send("status-503", {}, to="hooks")
    Relay().drain()
    rejected.refresh_from_db()
    busy.refresh_from_db()
    assert (rejected.state, rejected.attempts) == (OutboxState.SEND_ERROR, 1)
    # A 503 is a live server's answer: that message backs off on its own.
    assert (busy.state, busy.attempts) == (OutboxState.SHOULD_BE_SENT, 1)
    assert busy.available_at > timezone.now()
    assert circuits.state("hooks") is CircuitState.CLOSED


@pytest.mark.parametrize("policy", ["resend", "hold"])
def test_a_connection_dropped_mid_request_is_uncertain_counted_and_waits_for_the_circuit(
    endpoint, configure_outbox, policy
):
    configure_outbox(
        DESTINATIONS={
            "hooks": {
                "TRANSPORT": "http",
                "URL": f"http://127.0.0.1:{endpoint.port}/{{type}}",
                "TIMEOUT": 2,
                "UNCERTAIN": policy,
            }
        }
    )
    endpoint.start()
    message = django_outbox.send("drop", {}, to="hooks")
    Relay().drain()
    message.refresh_from_db()
    assert message.attempts == 1  # it was handed over: the attempt counts
    assert circuits.state("hooks") is CircuitState.OPEN
    if policy == "hold":
        assert (message.state, message.uncertain) == (OutboxState.SEND_ERROR, True)
    else:
        # Resent when the circuit closes, not after a backoff of its own.
        assert message.state == OutboxState.SHOULD_BE_SENT
        assert message.available_at <= timezone.now()
        assert "RemoteProtocolError" in message.last_error or "ReadError" in message.last_error


def test_one_message_that_cannot_connect_does_not_hold_back_the_destination(
    endpoint, configure_outbox
):
    # Given a URL whose host is the message's type: one type's host refuses, the
    # others' is up (the destination is up, one message cannot reach its host)
    configure_outbox(
        CIRCUIT_PROBE_SECONDS=0.05,
        CIRCUIT_PROBE_MAX_SECONDS=0.1,
        DESTINATIONS={"hooks": {"TRANSPORT": "http", "URL": "http://{type}/in", "TIMEOUT": 2}},
    )
    endpoint.start()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refused = f"127.0.0.1:{closed.getsockname()[1]}"
    bad = django_outbox.send(refused, {}, to="hooks")
    Relay().drain()  # it cannot connect: the circuit opens
    for n in range(4):
        django_outbox.send(f"127.0.0.1:{endpoint.port}", {"n": n}, to="hooks")

    # When the relay runs for a second
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        Relay().drain()
        time.sleep(0.02)

    # Then the messages whose host answers are sent; only the one that cannot connect waits
    sent = OutboxMessage.objects.filter(state=OutboxState.SENT).count()
    bad.refresh_from_db()
    assert (bad.state, bad.attempts) == (OutboxState.SHOULD_BE_SENT, 0)
    assert sent == 4


def test_the_health_page_shows_how_long_messages_have_waited_for_a_destination_that_is_down(
    endpoint, configure_outbox
):
    from django_outbox.health import figures

    # Given an endpoint that refuses connections, probed every 0.05-0.1 s
    configure_outbox(
        CIRCUIT_PROBE_SECONDS=0.05,
        CIRCUIT_PROBE_MAX_SECONDS=0.1,
        DESTINATIONS={"hooks": {"TRANSPORT": "http", "URL": f"http://127.0.0.1:{endpoint.port}/"}},
    )
    django_outbox.send("ok", {}, to="hooks")
    due_since = time.monotonic()

    # When the relay keeps probing for 1.5 s
    while time.monotonic() - due_since < 1.5:
        Relay().drain()
        time.sleep(0.02)

    # Then the oldest due message has waited since it was sent, not since the last probe
    oldest = figures.read(parts=["outbox"]).parts["outbox"].oldest_due_seconds
    assert oldest is not None and oldest >= 1.4
