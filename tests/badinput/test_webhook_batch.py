"""A batch to the webhook view: a batch that cannot be read is refused whole and stores
nothing; a message that cannot be read is refused alone, and the good one beside it is
stored."""

import json
import time

import pytest
from django.urls import reverse

from django_outbox import signing
from django_outbox.models import InboxMessage
from tests.badinput.cases import ACCEPTED, ALONE, REFUSED, WEBHOOK_BATCH
from tests.badinput.support import grown, params, table_counts

pytestmark = pytest.mark.django_db

SECRET = "webhook-secret"
INBOX = InboxMessage._meta.db_table
GOOD = {
    "headers": {
        "outbox-message-id": "good",
        "outbox-type": "payment.captured",
        "outbox-key": "other",
        "outbox-sequence": "1",
    },
    "body": '{"order": "o2"}',
}


@pytest.fixture(autouse=True)
def hooks(configure_outbox):
    configure_outbox(
        INBOX={
            "SOURCES": {
                "partner": {
                    "TRANSPORT": "webhook",
                    "SECRET": SECRET,
                    "MAX_BODY_BYTES": 1000,
                    "MAX_BATCH_BYTES": 4000,
                    "MAX_BATCH": 5,
                }
            }
        }
    )


def body_of(case):
    """The batch's body: the case's message (or *count* good ones) and a good one."""
    given = case.given
    if "raw" in given:
        return given["raw"]
    headers = {"outbox-message-id": f"b-{case.id}", "outbox-type": "payment.captured"}
    headers.update(given.get("headers", {}))
    headers = {name: value for name, value in headers.items() if value is not None}
    text = given.get("body_text") or given.get("body", b'{"order": "o1"}').decode()
    first = {"headers": headers, "body": text, **given.get("item", {})}
    if "count" in given:
        messages = [
            {"headers": {**headers, "outbox-message-id": f"b-{n}"}, "body": text}
            for n in range(given["count"])
        ]
    elif given.get("twice"):
        messages = [first, first]
    else:
        messages = [first, GOOD]
    return json.dumps({"messages": messages}).encode()


def signature_of(case, body):
    sign = case.given.get("sign", "good")
    if sign == "single":
        return signing.sign(SECRET, body, headers={})
    secret = "another-secret" if sign == "other-secret" else SECRET
    timestamp = int(time.time()) - 3600 if sign == "an-hour-ago" else None
    return signing.sign_batch(secret, body, timestamp=timestamp)


@pytest.mark.parametrize("case", params(WEBHOOK_BATCH))
def test_webhook_batch(case, client):
    body = body_of(case)
    before = table_counts()
    response = client.post(
        reverse("django_outbox:webhook", args=["partner"]),
        data=body,
        content_type="application/json",
        headers={"Outbox-Signature": signature_of(case, body)},
    )
    expect = case.expect
    assert response.status_code == int(expect.what), response.content
    if expect.kind == REFUSED:
        assert expect.says in response.json()["reason"]
        assert grown(before, table_counts()) == {}
        return
    first, second = response.json()["results"]
    if expect.kind == ALONE:
        assert (first["status"], second["status"]) == ("refused", "stored")
        assert expect.says in first["reason"]
        assert grown(before, table_counts()) == {INBOX: 1}
        assert InboxMessage.objects.get().message_id == "good"
    else:
        assert expect.kind == ACCEPTED
        assert (first["status"], second["status"]) == ("stored", expect.says)
        assert grown(before, table_counts()) == {INBOX: 1}
