"""A relay SIGKILLed between publishing and recording: resent under resend, held under hold."""

import signal
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

import django_outbox
from django_outbox.models import OutboxMessage, OutboxState
from django_outbox.outbox.maintenance import sweep
from tests.acceptance.helpers import kombu_ids_in_redis, stop, wait_for
from tests.conftest import spawn_manage, subprocess_env

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.row_locks,
    pytest.mark.redis,
    pytest.mark.processes,
]

#: Long enough that a loaded machine's stalls between the claim and the first sweep do
#: not expire it for real; the later sweep is pinned past it.
LEASE = 30.0


@pytest.mark.parametrize("policy", ["resend", "hold"])
def test_relay_killed_after_publish_before_record(
    configure_outbox, redis_url, queue_name, tmp_path: Path, policy
):
    configure_outbox(
        DESTINATIONS={
            "default": {
                "TRANSPORT": "kombu",
                "URL": redis_url,
                "QUEUE": queue_name,
                "UNCERTAIN": policy,
            }
        },
        LEASE_SECONDS=LEASE,
    )
    messages = [django_outbox.send("order.created", {"n": n}, key="order:1") for n in range(3)]
    ids = [str(m.message_id) for m in messages]
    marker = tmp_path / "published"
    relay = spawn_manage(
        "outbox_relay",
        "--no-listen",
        env=subprocess_env(TESTPROJECT_FREEZE_AFTER_PUBLISH=str(marker)),
    )
    try:
        wait_for(marker.exists, timeout=30, what="the relay to publish its batch")
    finally:
        stop(relay, signal.SIGKILL)
    assert relay.returncode == -signal.SIGKILL

    # The broker has the batch; the database still says "sending".
    assert kombu_ids_in_redis(redis_url, queue_name) == ids
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {OutboxState.SENDING}

    # Before the lease expires nothing is touched.
    assert sweep(now=timezone.now(), time_budget=1)["resent"] == 0

    later = timezone.now() + timedelta(seconds=LEASE + 1)
    counts = sweep(now=later, time_budget=5)
    rows = list(OutboxMessage.objects.order_by("sequence"))
    if policy == "resend":
        assert (counts["resent"], counts["sent"]) == (3, 3)
        assert {r.state for r in rows} == {OutboxState.SENT}
        assert all("outcome uncertain" in r.last_error for r in rows)
        # At-least-once: the batch is at the broker twice, in order each time.
        assert kombu_ids_in_redis(redis_url, queue_name) == ids + ids
    else:
        assert (counts["held"], counts["sent"]) == (3, 0)
        assert {(r.state, r.uncertain) for r in rows} == {(OutboxState.SEND_ERROR, True)}
        assert kombu_ids_in_redis(redis_url, queue_name) == ids
        # An operator who checked downstream requeues them: never lost.
        assert OutboxMessage.objects.requeue() == 3
        assert sweep(time_budget=5)["sent"] == 3
        assert kombu_ids_in_redis(redis_url, queue_name) == ids + ids
