"""Per-key order with four concurrent relays and injected failures on one key."""

import json
from collections import defaultdict

import pytest
import redis
from django.db import transaction

import django_outbox
from django_outbox.models import OutboxMessage, OutboxState
from tests.acceptance.helpers import stop, wait_for
from tests.conftest import spawn_manage

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.row_locks,
    pytest.mark.redis,
    pytest.mark.processes,
]

KEYS = 12
PER_KEY = 40
BAD_KEY = "key-0"
BAD_AT = 30  # the sequence of BAD_KEY that fails permanently


def test_order_holds_per_key_and_a_failing_key_holds_back_only_itself(configure_outbox, redis_url):
    configure_outbox(
        DESTINATIONS={
            "default": {
                "TRANSPORT": "testproject.transports.RecordingTransport",
                "REDIS_URL": redis_url,
                "LIST": "publish-log",
                "FAIL_KEY": BAD_KEY,
                "FAIL_RATE": 0.3,
                "FAIL_PERMANENTLY_AT": BAD_AT,
            }
        },
        RETRY_BASE_SECONDS=0.02,
        RETRY_MAX_SECONDS=0.1,
        MAX_ATTEMPTS=100,
        BATCH_SIZE=25,
    )
    # Interleave keys in small transactions, as real traffic would.
    for round_ in range(PER_KEY):
        with transaction.atomic():
            for k in range(KEYS):
                django_outbox.send("event", {"round": round_}, key=f"key-{k}")

    relays = [spawn_manage("outbox_relay", "--interval", "0.05", "--no-listen") for _ in range(4)]
    try:

        def settled():
            open_good = (
                OutboxMessage.objects.exclude(key=BAD_KEY).exclude(state=OutboxState.SENT).exists()
            )
            bad_failed = OutboxMessage.objects.filter(
                key=BAD_KEY, state=OutboxState.SEND_ERROR
            ).exists()
            return not open_good and bad_failed

        wait_for(settled, timeout=90, what="every good key sent and the bad key dead-lettered")
    finally:
        outputs = [stop(p) for p in relays]
    for process, output in zip(relays, outputs, strict=True):  # clean stop on SIGTERM
        assert process.returncode == 0, f"exit {process.returncode}: {output[-3000:]}"

    client = redis.Redis.from_url(redis_url)
    log = [json.loads(item) for item in client.lrange("publish-log", 0, -1)]
    by_key = defaultdict(list)
    for key, sequence, _ in log:
        by_key[key].append(sequence)

    for k in range(1, KEYS):
        assert by_key[f"key-{k}"] == list(range(1, PER_KEY + 1)), f"key-{k}: {by_key[f'key-{k}']}"
    assert by_key[BAD_KEY] == list(range(1, BAD_AT)), "the bad key broke order or ran past"

    bad = dict(OutboxMessage.objects.filter(key=BAD_KEY).values_list("sequence", "state"))
    assert all(bad[s] == OutboxState.SENT for s in range(1, BAD_AT))
    assert bad[BAD_AT] == OutboxState.SEND_ERROR
    assert all(bad[s] == OutboxState.SHOULD_BE_SENT for s in range(BAD_AT + 1, PER_KEY + 1))
    retried = OutboxMessage.objects.filter(key=BAD_KEY, attempts__gt=1).count()
    assert retried > 0, "the injected retryable failures never happened"
