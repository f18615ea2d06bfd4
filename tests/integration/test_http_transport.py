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

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Handler.received.append((self.path, dict(self.headers), body))
        name = self.path.strip("/")
        if name == "slow":
            time.sleep(1.5)
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


@pytest.fixture
def server(configure_outbox):
    Handler.received = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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
    assert signing.verify(SECRET, body, headers["outbox-signature"])
    assert not signing.verify("wrong-secret", body, headers["outbox-signature"])


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


def test_connection_refused_is_retried(configure_outbox):
    configure_outbox(DESTINATIONS={"default": {"TRANSPORT": "http", "URL": "http://127.0.0.1:9/x"}})
    message = deliver("ok")
    assert message.state == OutboxState.SHOULD_BE_SENT
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
    assert [p for p, _, _ in Handler.received] == ["/status-503", "/ok"]


def test_non_ascii_keys_travel_as_utf8_header_bytes(server):
    message = django_outbox.send("ok", {}, key="city:Zürich")
    Relay().drain()
    message.refresh_from_db()
    assert message.state == OutboxState.SENT
    [(_, headers, _)] = Handler.received
    headers = {k.lower(): v for k, v in headers.items()}
    # http.server decodes header bytes as latin-1
    assert headers["outbox-key"].encode("latin-1").decode("utf-8") == "city:Zürich"


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
    assert (message.state, message.uncertain) == (OutboxState.SHOULD_BE_SENT, False)
