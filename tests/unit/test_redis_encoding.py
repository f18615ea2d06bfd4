"""The Redis publisher writes kombu's message JSON piece by piece: what it writes must
read back as exactly the message ``json.dumps`` of kombu's structure would give, for
any text a payload, a header, a type or a key may hold."""

import json
import uuid
from datetime import UTC, datetime

import pytest

from django_outbox.outbox.envelope import Envelope
from django_outbox.outbox.transports.kombu import _RedisPublisher

TEXTS = [
    "plain",
    'quotes " and \\ backslashes',
    "controls \n \r \t \x00 \x1f \x7f",
    "unicode é ü 中文 😀 \u2028 \u2029",
    "{braces} [brackets], colons: and commas",
    "",
]


def publisher(**options):
    return _RedisPublisher({"url": "redis://127.0.0.1:6379/0", "queue": "q", **options})


def reference(pub, envelope, tag):
    """kombu's Redis message for *envelope*, as json.dumps writes it."""
    message_id = str(envelope.message_id)
    return {
        "body": envelope.body_text(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": envelope.headers,
        "properties": {
            "delivery_tag": tag,
            "delivery_mode": 2,
            "priority": 0,
            "message_id": message_id,
            "correlation_id": envelope.correlation_id or message_id,
            "type": envelope.type,
            "delivery_info": {"exchange": "", "routing_key": pub.route(envelope)},
        },
    }


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("routing_key", [None, "orders.{type}.{key}"])
@pytest.mark.parametrize("user_headers", [True, False], ids=["user-headers", "standard-only"])
def test_encoded_message_reads_back_as_the_reference(text, routing_key, user_headers):
    pub = publisher(routing_key=routing_key) if routing_key else publisher()
    message_id = uuid.uuid4()
    envelope = Envelope(
        message_id=message_id,
        type=f"order.{text}",
        destination="d",
        payload={"note": text},
        payload_json=json.dumps({"note": text}, ensure_ascii=False),
        key=f"k{text}",
        sequence=7,
        correlation_id=text or None,
        created_at=datetime(2026, 11, 27, 12, 0, 0, 123456, tzinfo=UTC),
        attempt=3,
        user_headers={f"x-{text}": text, "tenant": "acme"} if user_headers else {},
        message_id_text=str(message_id),
    )
    encoded = pub.encode(envelope)
    decoded = json.loads(encoded)
    tag = decoded["properties"]["delivery_tag"]
    assert decoded == reference(pub, envelope, tag)
    assert json.loads(decoded["body"]) == {"note": text}
    encoded.encode("utf-8")  # what publish() sends


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"key": None, "sequence": None},
        {"created_at": None},
        {"key": "k", "sequence": 12, "correlation_id": "c-1"},
        {"user_headers": {"Outbox-Type": "forged", "x-trace": "1"}},
    ],
    ids=["minimal", "no-key", "no-created-at", "keyed", "user-header-named-as-standard"],
)
def test_the_headers_json_is_the_headers(fields):
    envelope = Envelope(
        message_id=uuid.uuid4(),
        type="order.created",
        destination="d",
        payload=1,
        **{"created_at": datetime(2026, 11, 28, 3, 0, tzinfo=UTC), **fields},
    )
    assert json.loads(envelope.headers_json()) == envelope.headers


def test_delivery_tags_are_unique_per_publish():
    pub = publisher()
    envelope = Envelope(message_id=uuid.uuid4(), type="t", destination="d", payload=1)
    tags = {json.loads(pub.encode(envelope))["properties"]["delivery_tag"] for _ in range(100)}
    assert len(tags) == 100


def test_a_lone_surrogate_is_refused_as_json_dumps_would_be_at_encoding():
    pub = publisher()
    envelope = Envelope(
        message_id=uuid.uuid4(), type="bad\ud800", destination="d", payload=1, payload_json="1"
    )
    with pytest.raises(UnicodeEncodeError):
        pub.encode(envelope).encode("utf-8")
