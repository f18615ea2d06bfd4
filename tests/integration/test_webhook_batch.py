"""Batched webhook deliveries: the ``http`` transport's ``BATCH`` posts many messages in
one request signed as a batch (``b2=``), and the webhook view answers for each. The
end-to-end tests post through the real transport to a live server."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import DataError
from django.urls import reverse

import django_outbox
from django_outbox import signing
from django_outbox.inbox.consumers import webhook
from django_outbox.models import InboxMessage, OutboxMessage, OutboxState
from django_outbox.outbox.relay import Relay

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "batch-secret"


@pytest.fixture
def hooks(configure_outbox):
    configure_outbox(
        INBOX={
            "SOURCES": {
                "partner": {
                    "TRANSPORT": "webhook",
                    "SECRET": SECRET,
                    "MAX_BODY_BYTES": 1000,
                    "MAX_BATCH": 5,
                    "MAX_BATCH_BYTES": 3000,
                }
            }
        }
    )


def item(message_id, body=b'{"n": 1}', key=None, sequence=None, **headers):
    headers = {"outbox-message-id": message_id, "outbox-type": "payment.captured", **headers}
    if key is not None:
        headers.update({"outbox-key": key, "outbox-sequence": str(sequence)})
    return {"headers": headers, "body": body.decode()}


def post_batch(client, items, *, secret=SECRET, timestamp=None, raw=None, signature=None):
    body = raw if raw is not None else json.dumps({"messages": items}).encode()
    if signature is None:
        signature = signing.sign_batch(secret, body, timestamp=timestamp)
    return client.post(
        reverse("django_outbox:webhook", args=["partner"]),
        data=body,
        content_type="application/json",
        headers={"Outbox-Signature": signature},
    )


def statuses(response):
    return [(r["message_id"], r["status"]) for r in response.json()["results"]]


def test_a_batch_is_stored_in_order_and_answered_for_each_message(client, hooks):
    response = post_batch(
        client,
        [
            item("a-1", key="order:1", sequence=1),
            item("b-1", b'{"n": 2}', key="order:2", sequence=1),
            item("a-2", b'{"n": 3}', key="order:1", sequence=2),
            item("free", b"[1, 2]", **{"outbox-tenant": "acme", "traceparent": "00-ab-cd-01"}),
        ],
    )
    assert response.status_code == 200
    assert statuses(response) == [
        ("a-1", "stored"),
        ("b-1", "stored"),
        ("a-2", "stored"),
        ("free", "stored"),
    ]
    stored = {m.message_id: m for m in InboxMessage.objects.all()}
    assert [(stored[i].key, stored[i].sequence) for i in ("a-1", "a-2", "b-1")] == [
        ("order:1", 1),
        ("order:1", 2),
        ("order:2", 1),
    ]
    assert stored["a-2"].payload == {"n": 3}
    assert stored["free"].payload == [1, 2]
    assert stored["free"].headers["outbox-tenant"] == "acme"
    assert stored["free"].headers["traceparent"] == "00-ab-cd-01"


def test_a_replayed_batch_stores_nothing_again_and_an_id_twice_is_stored_once(client, hooks):
    items = [item("x-1"), item("x-2"), item("x-1", b'{"other": true}')]
    first = post_batch(client, items)
    again = post_batch(client, items)
    assert statuses(first) == [("x-1", "stored"), ("x-2", "stored"), ("x-1", "duplicate")]
    assert statuses(again) == [("x-1", "duplicate"), ("x-2", "duplicate"), ("x-1", "duplicate")]
    assert InboxMessage.objects.get(message_id="x-1").payload == {"n": 1}
    assert InboxMessage.objects.count() == 2


def test_an_unreadable_message_is_refused_alone_and_holds_back_its_key(client, hooks):
    response = post_batch(
        client,
        [
            item("k-1", b'{"broken": ', key="order:1", sequence=1),
            item("k-2", key="order:1", sequence=2),
            item("other", key="order:2", sequence=1),
            item("big", json.dumps({"blob": "x" * 1200}).encode()),
            item("no-type", **{"outbox-type": ""}),
        ],
    )
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["status"] for r in results] == ["refused", "skipped", "stored", "refused", "refused"]
    assert "not UTF-8 JSON" in results[0]["reason"]
    assert "over the limit of 1000" in results[3]["reason"]
    assert "no message type" in results[4]["reason"]
    assert list(InboxMessage.objects.values_list("message_id", flat=True)) == ["other"]


@pytest.mark.parametrize(
    ("case", "status", "reason"),
    [
        ("bad signature", 401, "bad signature"),
        ("stale", 401, "outside the 300 s window"),
        ("a v2 digest under b2=", 401, "bad signature"),
        ("over MAX_BATCH_BYTES", 413, "over 3000"),
        ("over MAX_BATCH", 400, "over MAX_BATCH (5)"),
        ("not JSON", 400, "not UTF-8 JSON"),
        ("no messages", 400, 'no "messages" list'),
        ("an item of another shape", 400, "message 1: not"),
        ("a header that is not text", 400, "is not UTF-8 text"),
        ("two headers differing in case", 400, "two headers named"),
    ],
)
def test_bad_batches_are_refused_whole_and_nothing_is_stored(client, hooks, case, status, reason):
    items = [item("m-1"), item("m-2")]
    kwargs = {}
    if case == "bad signature":
        kwargs["secret"] = "another-secret"
    elif case == "stale":
        kwargs["timestamp"] = int(time.time()) - 3600
    elif case == "a v2 digest under b2=":
        body = json.dumps({"messages": items}).encode()
        single = signing.sign(SECRET, body, headers={})
        kwargs["signature"] = single.replace("v2=", "b2=")
    elif case == "over MAX_BATCH_BYTES":
        items = [item(f"m-{n}", json.dumps({"blob": "x" * 900}).encode()) for n in range(4)]
    elif case == "over MAX_BATCH":
        items = [item(f"m-{n}") for n in range(6)]
    elif case == "not JSON":
        kwargs["raw"] = b'{"messages": ['
    elif case == "no messages":
        items = []
    elif case == "an item of another shape":
        items = [item("m-1"), {"headers": {}, "body": {"n": 1}}]
    elif case == "a header that is not text":
        items = [item("m-1", **{"outbox-attempt": 3})]
    elif case == "two headers differing in case":
        items = [item("m-1", **{"Outbox-Tenant": "a", "outbox-tenant": "b"})]
    response = post_batch(client, items, **kwargs)
    assert response.status_code == status
    assert reason in response.json()["reason"]
    assert not InboxMessage.objects.exists()


def test_a_single_delivery_whose_body_looks_like_a_batch_is_one_message(client, hooks):
    """The kinds are told apart by the signature's scheme, not by the body: a payload
    shaped like a batch, signed as one message, is stored as that one message."""
    body = json.dumps({"messages": [item("inner-1")]}).encode()
    headers = {"outbox-type": "payment.captured", "outbox-message-id": "outer"}
    response = client.post(
        reverse("django_outbox:webhook", args=["partner"]),
        data=body,
        content_type="application/json",
        headers={"Outbox-Signature": signing.sign(SECRET, body, headers=headers), **headers},
    )
    assert (response.status_code, response.json()["status"]) == (200, "stored")
    [message] = InboxMessage.objects.all()
    assert message.message_id == "outer"
    assert message.payload == json.loads(body)


def test_a_batch_signature_on_a_single_delivery_is_not_taken_as_its_signature(client, hooks):
    body = b'{"n": 1}'
    headers = {"outbox-type": "payment.captured", "outbox-message-id": "lone"}
    response = client.post(
        reverse("django_outbox:webhook", args=["partner"]),
        data=body,
        content_type="application/json",
        headers={"Outbox-Signature": signing.sign_batch(SECRET, body), **headers},
    )
    assert response.status_code == 400
    assert "malformed batch" in response.json()["reason"]
    assert not InboxMessage.objects.exists()


def test_a_value_the_database_refuses_is_refused_alone(client, hooks, monkeypatch):
    real = webhook.receive_many

    def refusing(prepared, **kwargs):
        if any(row["message_id"] == "poison" for row, _ in prepared):
            raise DataError("value refused")
        return real(prepared, **kwargs)

    monkeypatch.setattr(webhook, "receive_many", refusing)
    response = post_batch(
        client,
        [
            item("p-1", key="k", sequence=1),
            item("poison", key="k", sequence=2),
            item("p-3", key="k", sequence=3),
            item("free"),
        ],
    )
    results = response.json()["results"]
    assert [r["status"] for r in results] == ["stored", "refused", "skipped", "stored"]
    assert "DataError: value refused" in results[1]["reason"]
    assert set(InboxMessage.objects.values_list("message_id", flat=True)) == {"p-1", "free"}


# The sender: the http transport with BATCH, through a live server.


@pytest.fixture
def partner(configure_outbox, live_server):
    def configure(batch=50, **source):
        configure_outbox(
            DESTINATIONS={
                "partner": {
                    "TRANSPORT": "http",
                    "URL": f"{live_server.url}/inbox/partner/",
                    "SECRET": SECRET,
                    "BATCH": batch,
                    "HEADERS": {"outbox-region": "eu", "Authorization": "Bearer t"},
                }
            },
            INBOX={"SOURCES": {"partner": {"TRANSPORT": "webhook", "SECRET": SECRET, **source}}},
        )

    return configure


@pytest.fixture
def batches(monkeypatch):
    """The number of batch requests the view answers."""
    seen = []
    real = webhook._batch

    def counting(config, body, signature):
        seen.append(len(json.loads(body)["messages"]))
        return real(config, body, signature)

    monkeypatch.setattr(webhook, "_batch", counting)
    return seen


def test_our_transport_delivers_in_batches_in_key_order(partner, batches):
    partner(batch=20)
    sent = [
        django_outbox.send(
            "payment.captured",
            {"n": n},
            to="partner",
            key=f"order:{n % 3}" if n % 4 else None,
            headers={"Outbox-Case": "Mixed", "outbox-case": "lower"} if n == 5 else None,
        )
        for n in range(60)
    ]
    assert Relay().drain().sent == 60
    assert sum(batches) == 60 and max(batches) <= 20 and len(batches) <= 8
    stored = {m.message_id: m for m in InboxMessage.objects.all()}
    assert set(stored) == {str(m.message_id) for m in sent}
    for key in ("order:0", "order:1", "order:2"):
        ours = [m for m in sent if m.key == key]
        assert [stored[str(m.message_id)].sequence for m in ours] == [m.sequence for m in ours]
    assert {m.headers["outbox-region"] for m in stored.values()} == {"eu"}
    assert "authorization" not in next(iter(stored.values())).headers
    # Headers whose names differ only in case go once, as a request of its own sends them.
    assert stored[str(sent[5].message_id)].headers["outbox-case"] == "lower"


def test_a_refused_message_fails_alone_and_its_key_waits(partner, batches):
    partner(batch=10, MAX_BODY_BYTES=300)
    first = django_outbox.send("payment.captured", {"blob": "x" * 400}, to="partner", key="k")
    behind = django_outbox.send("payment.captured", {"n": 2}, to="partner", key="k")
    other = django_outbox.send("payment.captured", {"n": 3}, to="partner", key="j")
    Relay().drain()
    assert batches == [3]
    first.refresh_from_db()
    behind.refresh_from_db()
    other.refresh_from_db()
    assert first.state == OutboxState.SEND_ERROR
    assert "over the limit of 300" in first.last_error
    assert behind.state == OutboxState.SHOULD_BE_SENT and behind.attempts == 0
    assert other.state == OutboxState.SENT
    assert list(InboxMessage.objects.values_list("message_id", flat=True)) == [
        str(other.message_id)
    ]


def test_a_batch_over_the_receivers_limit_goes_one_by_one(partner, batches, caplog):
    partner(batch=50, MAX_BATCH_BYTES=400)
    sent = [django_outbox.send("t", {"n": n, "pad": "y" * 60}, to="partner") for n in range(6)]
    assert Relay().drain().sent == 6
    # Offered as one batch, refused with 413 before it was read, then sent each alone.
    assert "a batch of 6 is too large" in caplog.text
    assert batches == []
    assert {m.message_id for m in InboxMessage.objects.all()} == {str(m.message_id) for m in sent}


class AnswersOk(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def test_an_answer_without_results_leaves_every_message_uncertain(configure_outbox):
    """A receiver that is not django-outbox's view answers 200 to anything: the sender
    cannot tell what it stored, so no message counts as sent."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), AnswersOk)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        configure_outbox(
            DESTINATIONS={
                "partner": {
                    "TRANSPORT": "http",
                    "URL": f"http://127.0.0.1:{httpd.server_address[1]}/",
                    "SECRET": SECRET,
                    "BATCH": 10,
                }
            }
        )
        for n in range(3):
            django_outbox.send("t", {"n": n}, to="partner")
        result = Relay().drain()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert result.sent == 0
    for message in OutboxMessage.objects.all():
        assert message.state == OutboxState.SHOULD_BE_SENT
        assert "no result for each message" in message.last_error


def test_a_payload_with_non_ascii_text_arrives_as_sent(partner, batches):
    partner(batch=5)
    first = django_outbox.send("t", {"a": "ünïcode \u2028"}, to="partner")
    django_outbox.send("t", {"b": 2}, to="partner")
    assert Relay().drain().sent == 2
    assert batches == [2]
    stored = InboxMessage.objects.get(message_id=str(first.message_id))
    assert stored.payload == {"a": "ünïcode \u2028"}


def test_each_message_carries_its_idempotency_key_as_a_request_of_its_own_would(partner, batches):
    """A source that reads the id from ``Idempotency-Key`` reads it in a batch too."""
    partner(batch=5, MESSAGE_ID_HEADER="Idempotency-Key")
    sent = [django_outbox.send("t", {"n": n}, to="partner", key="k") for n in range(3)]
    assert Relay().drain().sent == 3
    assert batches == [3]
    stored = InboxMessage.objects.order_by("sequence")
    assert [m.message_id for m in stored] == [str(m.message_id) for m in sent]


def test_a_message_that_cannot_be_a_batch_item_goes_alone(partner, batches, monkeypatch):
    from django_outbox.outbox.transports.http import HttpTransport

    real = HttpTransport.batch_item

    def failing(self, envelope):
        if envelope.payload == {"n": 2}:
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        return real(self, envelope)

    monkeypatch.setattr(HttpTransport, "batch_item", failing)
    partner(batch=10)
    for n in range(5):
        django_outbox.send("t", {"n": n}, to="partner")
    assert Relay().drain().sent == 5
    # Two batches around it; it went as a request of its own, which could encode it.
    assert batches == [2, 2]
    assert InboxMessage.objects.count() == 5


def test_an_unexpected_error_posting_a_batch_leaves_its_messages_uncertain(partner, monkeypatch):
    from django_outbox.outbox.transports.http import HttpTransport

    def broken(self, url, body, headers):
        raise RuntimeError("a bug")

    monkeypatch.setattr(HttpTransport, "_post", broken)
    partner(batch=10)
    for n in range(3):
        django_outbox.send("t", {"n": n}, to="partner")
    assert Relay().drain().sent == 0
    for message in OutboxMessage.objects.all():
        assert message.state == OutboxState.SHOULD_BE_SENT
        assert "RuntimeError: a bug" in message.last_error
