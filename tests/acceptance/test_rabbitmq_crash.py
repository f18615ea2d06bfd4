"""RabbitMQ crashes (SIGKILL) while a relay publishes through the Celery transport:
every message recorded as sent is in the queue after the broker restarts.

Real processes and a real crash: the broker is killed without a chance to
flush, so only what it confirmed (written to disk) survives; the relay
records a message as sent only after its confirm (``confirm_publish``).
"""

import signal
import time

import pytest

import django_outbox
from django_outbox.models import OutboxMessage, OutboxState
from tests import services
from tests.acceptance.helpers import stop, wait_for
from tests.conftest import spawn_manage, subprocess_env
from tests.integration.test_kombu_transport import drain_queue

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.row_locks,
    pytest.mark.rabbitmq,
    pytest.mark.processes,
    pytest.mark.broker_crash,
]

MESSAGES = 3000


def sent_count():
    return OutboxMessage.objects.filter(state=OutboxState.SENT).count()


def test_nothing_recorded_as_sent_is_lost_when_rabbitmq_crashes(
    configure_outbox, amqp_url, queue_name
):
    configure_outbox(
        DESTINATIONS={
            "billing": {"TRANSPORT": "celery", "TASK": "billing.charge_order", "QUEUE": queue_name}
        },
        BATCH_SIZE=50,
        RETRY_BASE_SECONDS=0.5,
        RETRY_MAX_SECONDS=4.0,
    )
    for n in range(MESSAGES):
        django_outbox.send("order.created", {"n": n}, to="billing")
    relay = spawn_manage(
        "outbox_relay", "--json", "--no-listen", env=subprocess_env(CELERY_BROKER_URL=amqp_url)
    )
    try:
        wait_for(lambda: sent_count() >= 300, timeout=60, what="the relay to publish")
        services.crash_rabbitmq()
        crashed_at = time.monotonic()
        sent_before_restart = sent_count()
        # The relay meets the dead broker: what it had not confirmed is not sent.
        wait_for(
            lambda: (
                OutboxMessage.objects.filter(attempts__gte=1, state=OutboxState.SHOULD_BE_SENT)
                .exclude(last_error="")
                .exists()
            ),
            timeout=30,
            what="the relay to fail on the dead broker",
        )
        sent_during_outage = sent_count() - sent_before_restart
        services.start_rabbitmq()
        down_for = time.monotonic() - crashed_at
        wait_for(lambda: sent_count() == MESSAGES, timeout=120, what="every message to be sent")
    finally:
        stop(relay)
        services.start_rabbitmq()
    received = [m.headers["id"] for m in drain_queue(amqp_url, queue_name, timeout=2.0)]
    sent_ids = {str(i) for i in OutboxMessage.objects.values_list("message_id", flat=True)}
    missing = sent_ids - set(received)
    print(
        f"RabbitMQ down {down_for:.1f} s; {sent_before_restart} sent before the crash, "
        f"{sent_during_outage} more recorded as the relay met the dead broker (confirmed "
        f"before the crash), {len(received)} task messages "
        f"in the queue for {MESSAGES} messages ({len(received) - len(set(received))} duplicates)"
    )
    assert not missing, f"{len(missing)} messages recorded as sent are not in the queue"


def test_relays_sigkilled_with_publisher_confirms_in_flight_lose_nothing(
    configure_outbox, amqp_url, queue_name
):
    """Relays publishing to RabbitMQ with confirms are SIGKILLed every half second, so
    kills land between publishes and their confirms: every message ends sent and is in
    the queue at least once, in key order for each key's first copies."""
    configure_outbox(
        DESTINATIONS={"default": {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": queue_name}},
        BATCH_SIZE=100,
    )
    for n in range(MESSAGES):
        django_outbox.send("order.created", {"n": n}, key=f"order:{n % 20}")
    kills = 0
    relay = spawn_manage("outbox_relay", "--json", "--no-listen", "--interval", "0.1")
    try:
        while kills < 6 and sent_count() < MESSAGES:
            time.sleep(0.5)
            stop(relay, signal.SIGKILL)
            kills += 1
            relay = spawn_manage("outbox_relay", "--json", "--no-listen", "--interval", "0.1")
        wait_for(lambda: sent_count() == MESSAGES, timeout=120, what="every message to be sent")
    finally:
        stop(relay)
    received = drain_queue(amqp_url, queue_name, timeout=2.0)
    ids = [m.headers["outbox-message-id"] for m in received]
    sent = {str(i) for i in OutboxMessage.objects.values_list("message_id", flat=True)}
    assert kills >= 1
    assert not sent - set(ids), "messages recorded as sent are missing from the queue"
    # Per key, the first copy of each message arrives in sequence order.
    first_seen: dict[str, list[int]] = {}
    seen: set[str] = set()
    for message in received:
        message_id = message.headers["outbox-message-id"]
        if message_id in seen:
            continue
        seen.add(message_id)
        first_seen.setdefault(message.headers["outbox-key"], []).append(
            int(message.headers["outbox-sequence"])
        )
    assert all(seqs == sorted(seqs) for seqs in first_seen.values())
    print(f"{kills} kills; {len(ids)} deliveries of {MESSAGES} messages")
