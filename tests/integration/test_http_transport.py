"""HTTP transport against a local server: 2xx sent, 4xx permanent, 5xx/timeouts retried."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import django_outbox
from django_outbox import signing
from django_outbox.models import OutboxMessage, OutboxState
from django_outbox.outbox.relay import Relay

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec-test"


class Handler(BaseHTTPRequestHandler):
    received: list = []

    in_flight = 0
    most_in_flight = 0
    lock = threading.Lock()

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Handler.received.append((self.path, dict(self.headers), body))
        name = self.path.strip("/")
        if name == "slow":
            time.sleep(1.5)
            status = 200
        elif name == "paced":  # an endpoint answering in 50 ms
            with Handler.lock:
                Handler.in_flight += 1
                Handler.most_in_flight = max(Handler.most_in_flight, Handler.in_flight)
            time.sleep(0.05)
            with Handler.lock:
                Handler.in_flight -= 1
            status = 200
        elif name.startswith("status-"):
            status = int(name.removeprefix("status-"))
        else:
            status = 200
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(f"reply {status}".encode())

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    # The default backlog of 5 overflows under 8 concurrent posts on a busy
    # machine: a dropped SYN costs a 1 s retransmit, past the 0.5 s timeout.
    request_queue_size = 128
    daemon_threads = True


@pytest.fixture
def server(configure_outbox):
    Handler.received = []
    Handler.most_in_flight = 0
    httpd = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/{{type}}"
    configure_outbox(
        DESTINATIONS={
            "default": {"TRANSPORT": "http", "URL": url, "SECRET": SECRET, "TIMEOUT": 0.5}
        }
    )
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def deliver(message_type):
    message = django_outbox.send(message_type, {"order_id": 1}, key="order:1")
    Relay().drain()
    message.refresh_from_db()
    return message


def test_2xx_is_sent_with_idempotency_key_and_a_verifiable_signature(server):
    message = deliver("ok")
    assert message.state == OutboxState.SENT
    [(path, headers, body)] = Handler.received
    headers = {k.lower(): v for k, v in headers.items()}
    assert path == "/ok"
    assert json.loads(body) == {"order_id": 1}
    assert headers["idempotency-key"] == str(message.message_id)
    assert headers["outbox-message-id"] == str(message.message_id)
    assert headers["outbox-key"] == "order:1"
    assert headers["outbox-sequence"] == "1"
    # The v2 signature covers the body and every outbox-* header and the Idempotency-Key
    # as they arrived (http.server hands header bytes over as Latin-1, like WSGI).
    signature = headers["outbox-signature"]
    assert signature.startswith("t=") and ",v2=" in signature and "v1=" not in signature
    wire = signing.wire_headers(headers)
    assert signing.check(SECRET, body, signature, headers=wire) == "v2"
    assert not signing.verify("wrong-secret", body, signature, headers=wire)
    forged = {**wire, "outbox-message-id": b"another-id"}
    assert not signing.verify(SECRET, body, signature, headers=forged)


@pytest.mark.parametrize("status", [400, 404, 422])
def test_4xx_is_a_permanent_failure(server, status):
    message = deliver(f"status-{status}")
    assert message.state == OutboxState.SEND_ERROR
    assert message.attempts == 1
    assert message.last_error.startswith(f"HTTP {status} from ")
    assert f"reply {status}" in message.last_error


@pytest.mark.parametrize("status", [500, 503, 429, 408])
def test_5xx_and_throttling_are_retried(server, status):
    message = deliver(f"status-{status}")
    assert message.state == OutboxState.SHOULD_BE_SENT
    assert message.attempts == 1
    assert f"HTTP {status}" in message.last_error


def test_timeout_is_retried(server):
    message = deliver("slow")
    assert message.state == OutboxState.SHOULD_BE_SENT
    assert "timeout" in message.last_error


def test_connection_refused_waits_uncounted(configure_outbox):
    configure_outbox(DESTINATIONS={"default": {"TRANSPORT": "http", "URL": "http://127.0.0.1:9/x"}})
    message = deliver("ok")
    assert (message.state, message.attempts) == (OutboxState.SHOULD_BE_SENT, 0)
    assert "ConnectError" in message.last_error


def test_connection_refused_without_the_breaker_is_a_counted_retry(configure_outbox):
    configure_outbox(
        CIRCUIT_BREAKER=False,
        DESTINATIONS={"default": {"TRANSPORT": "http", "URL": "http://127.0.0.1:9/x"}},
    )
    message = deliver("ok")
    assert (message.state, message.attempts) == (OutboxState.SHOULD_BE_SENT, 1)
    assert "ConnectError" in message.last_error


def test_a_failed_message_stops_its_key_but_not_others(server):
    first = django_outbox.send("status-503", {}, key="k")
    second = django_outbox.send("ok", {}, key="k")
    other = django_outbox.send("ok", {}, key="other")
    Relay().drain()
    states = dict(OutboxMessage.objects.values_list("pk", "state"))
    assert states[first.pk] == OutboxState.SHOULD_BE_SENT
    assert states[second.pk] == OutboxState.SHOULD_BE_SENT
    assert states[other.pk] == OutboxState.SENT
    # Keys go out concurrently: which of the two requests came first is not fixed.
    assert sorted(p for p, _, _ in Handler.received) == ["/ok", "/status-503"]


def test_non_ascii_keys_travel_as_utf8_header_bytes(server):
    message = django_outbox.send("ok", {}, key="city:Zürich")
    Relay().drain()
    message.refresh_from_db()
    assert message.state == OutboxState.SENT
    [(_, headers, _)] = Handler.received
    headers = {k.lower(): v for k, v in headers.items()}
    # http.server decodes header bytes as latin-1
    assert headers["outbox-key"].encode("latin-1").decode("utf-8") == "city:Zürich"
    # and the signature covers those bytes, not a re-encoding of the text
    assert signing.verify(
        SECRET, b"{}", headers["outbox-signature"], headers=signing.wire_headers(headers)
    )


def test_headers_differing_only_in_case_go_out_once_the_standard_one_winning(server):
    django_outbox.send(
        "ok",
        {},
        key="order:1",
        headers={"Outbox-Type": "forged.type", "X-Tenant": "a", "x-tenant": "b"},
    )
    Relay().drain()
    [(_, headers, body)] = Handler.received
    names = [name.lower() for name in headers]
    assert names.count("outbox-type") == 1 and names.count("x-tenant") == 1
    headers = {k.lower(): v for k, v in headers.items()}
    assert headers["outbox-type"] == "ok"
    assert headers["x-tenant"] in {"a", "b"}  # which one: the stored JSON's key order
    assert signing.verify(
        SECRET, body, headers["outbox-signature"], headers=signing.wire_headers(headers)
    )


def test_static_headers_are_sent_and_outbox_ones_among_them_signed(server, configure_outbox):
    url = f"http://127.0.0.1:{server.server_address[1]}/{{type}}"
    configure_outbox(
        DESTINATIONS={
            "default": {
                "TRANSPORT": "http",
                "URL": url,
                "SECRET": SECRET,
                "HEADERS": {"Authorization": "Bearer t", "Outbox-Tenant": "acme"},
            }
        }
    )
    deliver("ok")
    [(_, headers, body)] = Handler.received
    headers = {k.lower(): v for k, v in headers.items()}
    assert (headers["authorization"], headers["outbox-tenant"]) == ("Bearer t", "acme")
    wire = signing.wire_headers(headers)
    assert signing.verify(SECRET, body, headers["outbox-signature"], headers=wire)
    forged = {**wire, "outbox-tenant": b"evil"}
    assert not signing.verify(SECRET, body, headers["outbox-signature"], headers=forged)


def test_timeout_on_a_hold_destination_parks_the_message_as_uncertain(server, configure_outbox):
    url = f"http://127.0.0.1:{server.server_address[1]}/{{type}}"
    configure_outbox(
        DESTINATIONS={
            "default": {
                "TRANSPORT": "http",
                "URL": url,
                "SECRET": SECRET,
                "TIMEOUT": 0.5,
                "UNCERTAIN": "hold",
            }
        }
    )
    message = deliver("slow")
    # The POST went out and no answer came back: the receiver may have acted.
    assert (message.state, message.uncertain) == (OutboxState.SEND_ERROR, True)
    assert message.last_error.startswith("outcome uncertain, held for an operator: timeout")


def test_connection_refused_on_a_hold_destination_is_simply_retried(configure_outbox):
    configure_outbox(
        DESTINATIONS={
            "default": {"TRANSPORT": "http", "URL": "http://127.0.0.1:9/x", "UNCERTAIN": "hold"}
        }
    )
    message = deliver("ok")  # nothing reached a server: nothing is uncertain
    assert (message.state, message.uncertain, message.attempts) == (
        OutboxState.SHOULD_BE_SENT,
        False,
        0,
    )


def test_posts_go_out_concurrently_in_key_order_and_are_recorded_chunk_by_chunk(server):
    from django_outbox.signals import outbox_batch_published

    for n in range(60):
        django_outbox.send("paced", {"n": n}, key=f"order:{n % 3}")
    for n in range(40):
        django_outbox.send("paced", {"n": n})
    chunks = []

    def count(*, messages, **kwargs):
        chunks.append(len(messages))

    outbox_batch_published.connect(count)
    try:
        assert Relay().run_batch().sent == 100
    finally:
        outbox_batch_published.disconnect(count)
    # CONCURRENCY 8 by default: requests overlap, and outcomes are recorded every 32.
    assert Handler.most_in_flight > 1
    assert chunks == [32, 32, 32, 4]
    for key in ("order:0", "order:1", "order:2"):
        sequences = [
            int(headers["outbox-sequence"])
            for _, headers, _ in Handler.received
            if headers.get("outbox-key") == key
        ]
        assert sequences == sorted(sequences) and len(sequences) == 20


def test_a_failed_message_holds_back_the_rest_of_its_key_in_later_chunks(server):
    failing = django_outbox.send("status-503", {}, key="k")
    behind = [django_outbox.send("paced", {"n": n}, key="k") for n in range(40)]
    result = Relay().run_batch()
    assert (result.sent, result.retried, result.released) == (0, 1, 40)
    assert [path for path, _, _ in Handler.received] == ["/status-503"]
    failing.refresh_from_db()
    assert failing.state == OutboxState.SHOULD_BE_SENT
    assert {m.state for m in OutboxMessage.objects.filter(pk__in=[b.pk for b in behind])} == {
        OutboxState.SHOULD_BE_SENT
    }
