"""The webhook view: each bad request is refused with its status and reason and stores
nothing; the accepted ones store one row."""

import time

import pytest
from django.urls import reverse

from django_outbox import signing
from django_outbox.models import InboxMessage
from tests.badinput.cases import ACCEPTED, REFUSED, WEBHOOK
from tests.badinput.support import grown, params, table_counts

pytestmark = pytest.mark.django_db

SECRET = "webhook-secret"
INBOX = InboxMessage._meta.db_table


@pytest.fixture(autouse=True)
def hooks(configure_outbox):
    configure_outbox(
        INBOX={
            "SOURCES": {
                "partner": {"TRANSPORT": "webhook", "SECRET": SECRET, "MAX_BODY_BYTES": 1000},
                "queue": {"TRANSPORT": "kombu", "URL": "memory://", "QUEUE": "q"},
            }
        }
    )


def request_of(case):
    """(method, source, body, content type, headers as a WSGI server hands them over)."""
    given = case.given
    body = given.get("body", b'{"order": "o1"}')
    wire = {"outbox-message-id": f"w-{case.id}".encode(), "outbox-type": b"payment.captured"}
    for name, value in given.get("headers", {}).items():
        wire[name] = value.encode() if isinstance(value, str) else value
    wire = {name: value for name, value in wire.items() if value is not None}
    sign = given.get("sign", "good")
    timestamp = int(time.time()) - 3600 if sign == "an-hour-ago" else None
    secret = "another-secret" if sign == "other-secret" else SECRET
    signature = signing.sign(secret, body, headers=wire, timestamp=timestamp)
    if sign == "v1":
        stamp = int(signature.split(",")[0][2:])
        signature = f"t={stamp},v1={signing._digest_v1(SECRET, stamp, body)}"
    elif sign == "garbage":
        signature = "garbage"
    elif sign == "then-retype":
        wire["outbox-type"] = b"refund.issued"
    headers = {name: value.decode("latin-1") for name, value in wire.items()}
    if sign != "none":
        headers["Outbox-Signature"] = signature
    return (
        given.get("method", "post"),
        given.get("source", "partner"),
        body,
        given.get("content_type", "application/json"),
        headers,
    )


@pytest.mark.parametrize("case", params(WEBHOOK))
def test_webhook(case, client):
    method, source, body, content_type, headers = request_of(case)
    url = reverse("django_outbox:webhook", args=[source])
    before = table_counts()
    for _ in range(2 if case.given.get("twice") else 1):
        if method == "get":
            response = client.get(url, headers=headers)
        else:
            response = client.post(url, data=body, content_type=content_type, headers=headers)
    expect = case.expect
    assert response.status_code == int(expect.what), response.content
    if expect.kind == REFUSED:
        assert expect.says in response.json()["reason"]
        assert grown(before, table_counts()) == {}
    else:
        assert expect.kind == ACCEPTED
        assert response.json()["status"] == expect.says
        assert grown(before, table_counts()) == {INBOX: 1}
        row = InboxMessage.objects.get()
        key = case.given.get("headers", {}).get("outbox-key")
        assert row.key == (key.decode() if key else None)
