"""The webhook view: signed deliveries stored once; bad ones refused with nothing stored.
The end-to-end test posts through the outbox's real HTTP transport to a live server."""

import hashlib
import hmac
import json
import time
import uuid

import pytest
from django.db import connection
from django.urls import reverse

import django_outbox
from django_outbox import signing
from django_outbox.inbox.handling import Inbox
from django_outbox.models import InboxMessage, InboxState
from django_outbox.outbox.relay import Relay
from testproject.shop.models import Payment

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "webhook-secret"


@pytest.fixture
def hooks(configure_outbox):
    configure_outbox(
        INBOX={
            "SOURCES": {
                "partner": {"TRANSPORT": "webhook", "SECRET": SECRET, "MAX_BODY_BYTES": 1000},
                "queue": {"TRANSPORT": "kombu", "URL": "memory://", "QUEUE": "q"},
            }
        }
    )


def post(client, body, *, source="partner", secret=SECRET, timestamp=None, **headers):
    headers.setdefault("outbox-type", "payment.captured")
    headers.setdefault("outbox-message-id", str(uuid.uuid4()))
    signature = signing.sign(secret, body, headers=headers, timestamp=timestamp)
    return client.post(
        reverse("django_outbox:webhook", args=[source]),
        data=body,
        content_type="application/json",
        headers={"Outbox-Signature": signature, **headers},
    )


def test_a_signed_delivery_is_stored_once_and_a_replay_is_a_duplicate(client, hooks):
    body = json.dumps({"order": "o1"}).encode()
    first = post(
        client,
        body,
        **{"outbox-message-id": "w-1", "outbox-key": "order:1", "outbox-sequence": "4"},
    )
    again = post(client, body, **{"outbox-message-id": "w-1"})
    assert (first.status_code, first.json()["status"]) == (200, "stored")
    assert (again.status_code, again.json()["status"]) == (200, "duplicate")
    [message] = InboxMessage.objects.all()
    assert (message.source, message.message_id, message.type) == (
        "partner",
        "w-1",
        "payment.captured",
    )
    assert (message.key, message.sequence, message.payload) == ("order:1", 4, {"order": "o1"})


@pytest.mark.parametrize(
    ("case", "status", "reason"),
    [
        ("bad signature", 401, "bad signature"),
        ("stale", 401, "outside the 300 s window"),
        ("no signature", 401, "no Outbox-Signature header"),
        ("malformed", 400, "not UTF-8 JSON"),
        ("oversize", 413, "over 1000"),
        ("no type", 400, "no message type"),
        ("unknown source", 404, "unknown source"),
        ("not a webhook source", 404, "does not take webhooks"),
    ],
)
def test_bad_deliveries_are_refused_and_nothing_is_stored(client, hooks, case, status, reason):
    body = b'{"order": "o1"}'
    kwargs = {}
    if case == "bad signature":
        kwargs["secret"] = "another-secret"
    elif case == "stale":
        kwargs["timestamp"] = int(time.time()) - 3600
    elif case == "malformed":
        body = b'{"order": '
    elif case == "oversize":
        body = json.dumps({"blob": "x" * 2000}).encode()
    elif case == "no type":
        kwargs["outbox-type"] = ""
    elif case == "unknown source":
        kwargs["source"] = "nobody"
    elif case == "not a webhook source":
        kwargs["source"] = "queue"
    if case == "no signature":
        response = client.post(
            reverse("django_outbox:webhook", args=["partner"]),
            data=body,
            content_type="application/json",
            headers={"outbox-type": "t", "outbox-message-id": "x"},
        )
    else:
        response = post(client, body, **kwargs)
    assert response.status_code == status
    assert reason in response.json()["reason"]
    assert not InboxMessage.objects.exists()


def test_a_database_failure_answers_503_so_the_sender_retries(client, hooks, monkeypatch):
    from django_outbox.inbox.consumers import webhook

    def broken(*args, **kwargs):
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table_here")

    monkeypatch.setattr(webhook, "receive_prepared", broken)
    response = post(client, b"{}")
    assert response.status_code == 503
    assert not InboxMessage.objects.exists()


def test_our_http_transport_delivers_to_our_webhook(configure_outbox, live_server):
    url = f"{live_server.url}/inbox/partner/"
    configure_outbox(
        DESTINATIONS={"partner": {"TRANSPORT": "http", "URL": url, "SECRET": SECRET}},
        INBOX={"SOURCES": {"partner": {"TRANSPORT": "webhook", "SECRET": SECRET}}},
    )
    sent = [
        django_outbox.send(
            "payment.captured",
            {"order": f"o{n}"},
            to="partner",
            key="order:7",
            correlation_id=f"checkout-{n}",
            reply_to="payments",
            headers={"outbox-tenant": "acme", "X-Trace": "t-1"},
        )
        for n in range(3)
    ]
    assert Relay().drain().sent == 3
    stored = InboxMessage.objects.order_by("sequence")
    assert [m.message_id for m in stored] == [str(m.message_id) for m in sent]
    assert [m.sequence for m in stored] == [1, 2, 3]
    assert [m.correlation_id for m in stored] == ["checkout-0", "checkout-1", "checkout-2"]
    assert {m.headers["outbox-reply-to"] for m in stored} == {"payments"}
    assert {m.headers["outbox-tenant"] for m in stored} == {"acme"}
    assert Inbox().drain().done == 3
    assert set(stored.values_list("state", flat=True)) == {InboxState.HANDLED}
    assert Payment.objects.count() == 3


def test_a_non_ascii_key_passes_the_signature_end_to_end(configure_outbox, live_server):
    url = f"{live_server.url}/inbox/partner/"
    configure_outbox(
        DESTINATIONS={"partner": {"TRANSPORT": "http", "URL": url, "SECRET": SECRET}},
        INBOX={"SOURCES": {"partner": {"TRANSPORT": "webhook", "SECRET": SECRET}}},
    )
    django_outbox.send("payment.captured", {"order": "o1"}, to="partner", key="city:Zürich")
    # Signed over the UTF-8 bytes as sent, verified over the bytes as received.
    assert Relay().drain().sent == 1
    [message] = InboxMessage.objects.all()
    # The sender's text, not the bytes as the WSGI server decoded them (Latin-1).
    assert message.key == "city:Zürich"


# Guarantee 9: the signature covers the envelope. A request captured on the way
# (within the tolerance window) cannot be replayed under a new id, re-typed,
# re-keyed, reordered or re-routed without the secret.

PARTNER_URL = "http://billing.example/inbox/partner/"


@pytest.fixture
def captured(configure_outbox):
    """One request exactly as our HTTP transport builds and signs it: ``(body, headers)``,
    header values as a WSGI server hands them to Django (one Latin-1 character a byte)."""
    from django_outbox.conf import get_settings
    from django_outbox.outbox.envelope import Envelope
    from django_outbox.outbox.transports.http import HttpTransport

    configure_outbox(
        DESTINATIONS={"partner": {"TRANSPORT": "http", "URL": PARTNER_URL, "SECRET": SECRET}},
        INBOX={"SOURCES": {"partner": {"TRANSPORT": "webhook", "SECRET": SECRET}}},
    )
    django_outbox.send("payment.captured", {"order": "o0"}, to="partner", key="order:1")
    message = django_outbox.send(
        "payment.captured",
        {"order": "o1", "amount": "10.00"},
        to="partner",
        key="order:1",
        correlation_id="checkout-42",
        reply_to="payments",
    )
    message.refresh_from_db()
    envelope = Envelope.from_message(message)
    transport = HttpTransport(get_settings().outbox.destination("partner"))
    try:
        body = envelope.body()
        wire = transport.request_headers(envelope, body)
    finally:
        transport.close()
    headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in wire}
    assert headers["outbox-sequence"] == "2"
    assert headers["outbox-reply-to"] == "payments"
    return body, headers


def replay(client, body, headers, **changes):
    """POST *body* with *headers* as captured, some of them changed (``None`` drops one)."""
    headers = dict(headers)
    for name, value in changes.items():
        name = name.replace("_", "-").lower()
        if value is None:
            headers.pop(name)
        else:
            headers[name] = value
    content_type = headers.pop("content-type")
    return client.post(
        reverse("django_outbox:webhook", args=["partner"]),
        data=body,
        content_type=content_type,
        headers=headers,
    )


def test_the_captured_request_is_stored_once_and_its_exact_replay_is_a_duplicate(client, captured):
    body, headers = captured
    first = replay(client, body, headers)
    again = replay(client, body, headers)
    assert (first.status_code, first.json()["status"]) == (200, "stored")
    assert (again.status_code, again.json()["status"]) == (200, "duplicate")
    [message] = InboxMessage.objects.all()
    assert message.message_id == headers["outbox-message-id"] == headers["idempotency-key"]
    assert (message.type, message.key, message.sequence) == ("payment.captured", "order:1", 2)
    assert message.correlation_id == "checkout-42"
    assert message.headers["outbox-reply-to"] == "payments"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"outbox-message-id": "forged-id"}, "a new message id: stored again"),
        ({"idempotency-key": "forged-id"}, "a new fallback id"),
        (
            {"outbox-message-id": "forged-id", "idempotency-key": "forged-id"},
            "both ids, as a careful forger would",
        ),
        ({"outbox-type": "payment.refunded"}, "re-typed: another handler"),
        ({"outbox-key": "order:2"}, "moved to another object"),
        ({"outbox-sequence": "99"}, "reordered: skips the messages before it"),
        ({"outbox-correlation-id": "checkout-43"}, "matched to another request"),
        ({"outbox-reply-to": "elsewhere"}, "its reply routed elsewhere"),
        ({"outbox-attempt": "7"}, "any outbox-* header"),
        ({"outbox-priority": "high"}, "an outbox-* header added"),
        ({"outbox-reply-to": None}, "an outbox-* header removed"),
        ({"outbox-key": None, "outbox-sequence": None}, "ordering removed"),
        ({"outbox-correlation-id": ""}, "a header emptied (empty is not missing)"),
        ({"Outbox-Signature": None}, "the signature removed"),
    ],
)
def test_a_replay_with_any_envelope_field_changed_is_refused_and_not_stored(
    client, captured, caplog, change, why
):
    body, headers = captured
    assert replay(client, body, headers).json()["status"] == "stored"
    caplog.clear()
    response = replay(client, body, headers, **change)
    assert response.status_code == 401, why
    assert response.json()["status"] == "refused"
    assert [m.message_id for m in InboxMessage.objects.all()] == [headers["outbox-message-id"]]
    [record] = [r for r in caplog.records if r.name == "django_outbox.inbox"]
    assert record.levelname == "WARNING"
    assert "webhook partner refused (401)" in record.getMessage()


def test_a_replay_with_another_body_is_refused(client, captured):
    body, headers = captured
    forged = body.replace(b"10.00", b"1000.00")
    assert forged != body
    response = replay(client, forged, headers)
    assert (response.status_code, response.json()["reason"]) == (401, "bad signature")
    assert not InboxMessage.objects.exists()


def test_a_replay_under_a_new_id_is_refused_even_as_the_first_delivery(client, captured):
    body, headers = captured
    response = replay(
        client, body, headers, **{"outbox-message-id": "evt-new", "idempotency-key": "evt-new"}
    )
    assert (response.status_code, response.json()["reason"]) == (401, "bad signature")
    assert not InboxMessage.objects.exists()


def test_headers_outside_the_envelope_may_change(client, captured):
    body, headers = captured
    response = replay(client, body, headers, user_agent="curl/8", x_forwarded_for="10.0.0.9")
    assert response.json()["status"] == "stored"


def test_the_idempotency_key_alone_is_covered_as_the_message_id(client, hooks):
    body = b'{"order": "o1"}'
    headers = {"outbox-type": "payment.captured", "Idempotency-Key": "idem-1"}
    signature = signing.sign(SECRET, body, headers=headers)
    url = reverse("django_outbox:webhook", args=["partner"])

    def deliver(key):
        return client.post(
            url,
            data=body,
            content_type="application/json",
            headers={**headers, "Idempotency-Key": key, "Outbox-Signature": signature},
        )

    assert deliver("idem-1").json()["status"] == "stored"
    assert deliver("idem-2").status_code == 401
    assert list(InboxMessage.objects.values_list("message_id", flat=True)) == ["idem-1"]


def test_headers_a_source_maps_are_covered_too(client, configure_outbox):
    configure_outbox(
        INBOX={
            "SOURCES": {
                "partner": {
                    "TRANSPORT": "webhook",
                    "SECRET": SECRET,
                    "MESSAGE_ID_HEADER": "X-Event-Id",
                    "TYPE_HEADER": "X-Event-Type",
                    "KEY_HEADER": "X-Account",
                    "SEQUENCE_HEADER": "X-Revision",
                }
            }
        }
    )
    body = b'{"balance": 10}'
    headers = {
        "X-Event-Id": "evt_1",
        "X-Event-Type": "balance.changed",
        "X-Account": "acct_1",
        "X-Revision": "3",
    }
    mapped = ["X-Event-Id", "X-Event-Type", "X-Account", "X-Revision"]
    url = reverse("django_outbox:webhook", args=["partner"])

    def deliver(signature, **changes):
        return client.post(
            url,
            data=body,
            content_type="application/json",
            headers={**headers, **changes, "Outbox-Signature": signature},
        )

    covering = signing.sign(SECRET, body, headers=headers, also_cover=mapped)
    # Signed as if the mapped headers were not part of the envelope: refused.
    assert deliver(signing.sign(SECRET, body, headers=headers)).status_code == 401
    assert deliver(covering, **{"X-Event-Id": "evt_2"}).status_code == 401
    assert deliver(covering, **{"X-Revision": "4"}).status_code == 401
    assert deliver(covering).json()["status"] == "stored"
    [message] = InboxMessage.objects.all()
    assert (message.message_id, message.type, message.key, message.sequence) == (
        "evt_1",
        "balance.changed",
        "acct_1",
        3,
    )


def v1_signature(body, timestamp=None):
    """The old scheme, written out here because senders no longer make it."""
    ts = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(SECRET.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={digest}"


def post_v1(client, body, signature, **headers):
    return client.post(
        reverse("django_outbox:webhook", args=["partner"]),
        data=body,
        content_type="application/json",
        headers={
            "outbox-type": "payment.captured",
            "outbox-message-id": "v1-1",
            "Outbox-Signature": signature,
            **headers,
        },
    )


def test_a_v1_signature_is_refused_by_default_with_the_way_out(client, hooks, caplog):
    body = b'{"order": "o1"}'
    response = post_v1(client, body, v1_signature(body))
    assert response.status_code == 401
    reason = response.json()["reason"]
    assert reason.startswith("v1 signatures do not cover the envelope")
    assert "upgrade the sender to v2 or set DJANGO_OUTBOX['INBOX']['SOURCES']" in reason
    assert "['partner']['ACCEPT_V1'] = True" in reason
    assert "v1 signatures do not cover the envelope" in caplog.text
    assert not InboxMessage.objects.exists()


def test_accept_v1_takes_old_senders_during_a_rolling_upgrade(client, configure_outbox):
    configure_outbox(
        INBOX={
            "SOURCES": {"partner": {"TRANSPORT": "webhook", "SECRET": SECRET, "ACCEPT_V1": True}}
        }
    )
    body = b'{"order": "o1"}'
    assert post_v1(client, body, v1_signature(body)).json()["status"] == "stored"
    stale = v1_signature(body, timestamp=int(time.time()) - 3600)
    assert post_v1(client, body, stale, **{"outbox-message-id": "v1-2"}).status_code == 401
    # A v2 digest is judged alone: a valid v1 next to a forged v2 does not rescue it.
    headers = {"outbox-type": "payment.captured", "outbox-message-id": "v1-3"}
    v2 = signing.sign(SECRET, body, headers=headers)
    forged = f"{v2},v1={v1_signature(body).split('v1=')[1]}"
    response = post_v1(client, body, forged, **{"outbox-message-id": "v1-4"})
    assert (response.status_code, response.json()["reason"]) == (401, "bad signature")
    assert list(InboxMessage.objects.values_list("message_id", flat=True)) == ["v1-1"]
