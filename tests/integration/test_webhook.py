"""The webhook view: signed deliveries stored once; bad ones refused with nothing stored.
The end-to-end test posts through the outbox's real HTTP transport to a live server."""

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
    signature = signing.sign(secret, body, timestamp=timestamp)
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

    monkeypatch.setattr(webhook, "receive", broken)
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
        django_outbox.send("payment.captured", {"order": f"o{n}"}, to="partner", key="order:7")
        for n in range(3)
    ]
    assert Relay().drain().sent == 3
    stored = InboxMessage.objects.order_by("sequence")
    assert [m.message_id for m in stored] == [str(m.message_id) for m in sent]
    assert [m.sequence for m in stored] == [1, 2, 3]
    assert Inbox().drain().done == 3
    assert set(stored.values_list("state", flat=True)) == {InboxState.HANDLED}
    assert Payment.objects.count() == 3
