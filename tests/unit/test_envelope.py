import uuid
from datetime import UTC, datetime

from django_outbox.outbox.envelope import Envelope


def test_standard_headers_win_over_user_headers():
    message_id = uuid.uuid4()
    envelope = Envelope(
        message_id=message_id,
        type="order.created",
        destination="default",
        payload={"a": 1},
        key="order:1",
        sequence=3,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        attempt=2,
        user_headers={"outbox-message-id": "forged", "tenant": "acme"},
    )
    headers = envelope.headers
    assert headers["outbox-message-id"] == str(message_id)
    assert headers["outbox-type"] == "order.created"
    assert headers["outbox-key"] == "order:1"
    assert headers["outbox-sequence"] == "3"
    assert headers["outbox-correlation-id"] == str(message_id)
    assert headers["outbox-attempt"] == "2"
    assert headers["outbox-created-at"] == "2026-01-01T00:00:00+00:00"
    assert headers["tenant"] == "acme"
    assert envelope.body() == b'{"a":1}'


def test_unkeyed_messages_carry_no_key_headers():
    envelope = Envelope(message_id=uuid.uuid4(), type="t", destination="d", payload=[])
    assert "outbox-key" not in envelope.headers
    assert "outbox-sequence" not in envelope.headers
