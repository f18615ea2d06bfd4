"""Four relay processes over the same 5,000 messages publish each exactly once."""

import json
from collections import Counter

import pytest

from django_outbox.models import OutboxMessage, OutboxState
from tests.acceptance.helpers import kombu_ids_in_redis
from tests.conftest import spawn_manage

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.row_locks,
    pytest.mark.redis,
    pytest.mark.processes,
]

MESSAGES = 5000
RELAYS = 4


def test_four_relays_publish_each_message_exactly_once(configure_outbox, redis_url, queue_name):
    configure_outbox(
        DESTINATIONS={
            "default": {
                # A small pause per message keeps all four relays busy at once.
                "TRANSPORT": "testproject.transports.SlowKombuTransport",
                "URL": redis_url,
                "QUEUE": queue_name,
                "DELAY": 0.0004,
            }
        },
    )
    OutboxMessage.objects.bulk_create(
        OutboxMessage(type="order.created", destination="default", payload={"n": n})
        for n in range(MESSAGES)
    )
    relays = [
        spawn_manage("outbox_relay", "--json", "--until-empty", "--batch", "50", "--no-listen")
        for _ in range(RELAYS)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in relays]
    assert all(p.returncode == 0 for p in relays), outputs
    totals = [json.loads(out.strip().splitlines()[-1]) for out in outputs]

    published = Counter(kombu_ids_in_redis(redis_url, queue_name))
    expected = {str(m) for m in OutboxMessage.objects.values_list("message_id", flat=True)}
    assert set(published) == expected
    assert max(published.values()) == 1, "a message was published twice"
    assert OutboxMessage.objects.exclude(state=OutboxState.SENT).count() == 0
    assert sum(t["sent"] for t in totals) == MESSAGES
    assert sum(t["fenced"] for t in totals) == 0
    print("sent per relay:", [t["sent"] for t in totals])
    assert sum(1 for t in totals if t["sent"]) >= 2, f"relays did not overlap: {totals}"
