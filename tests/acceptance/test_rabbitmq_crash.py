"""RabbitMQ crashes (SIGKILL) while a relay publishes through the Celery transport:
every message recorded as sent is in the queue after the broker restarts.

Real processes and a real crash: the broker is killed without a chance to
flush, so only what it confirmed (written to disk) survives; the relay
records a message as sent only after its confirm (``confirm_publish``).
"""

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
