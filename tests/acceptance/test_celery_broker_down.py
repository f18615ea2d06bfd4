"""The Celery broker is unreachable when a transaction commits: the commit stands, the
failed trigger is logged, and the sweep delivers the message later. A real process and a
real refused connection, no monkeypatch."""

import pytest

from django_outbox.models import OutboxMessage, OutboxState
from django_outbox.outbox.relay import Relay
from django_outbox.outbox.transports.memory import mailbox
from tests.conftest import spawn_manage, subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

SEND = """
from django.db import transaction
import django_outbox
from testproject.shop.models import Order
with transaction.atomic():
    order = Order.objects.create(customer="c", total_cents=100)
    django_outbox.send("order.created", {"order_id": order.pk})
print("committed", order.pk)
"""


@pytest.mark.parametrize("in_background", [False, True])
def test_a_commit_stands_when_the_celery_broker_is_down(configure_outbox, in_background):
    configure_outbox(DISPATCH="celery", DISPATCH_IN_BACKGROUND=in_background)
    # Nothing listens on port 1: every connection to this broker is refused.
    env = subprocess_env(CELERY_BROKER_URL="redis://127.0.0.1:1/0")
    child = spawn_manage("shell", "-c", SEND, env=env)
    output, _ = child.communicate(timeout=60)
    assert child.returncode == 0, output
    assert "committed" in output
    # The trigger fails at once (kombu is told not to retry the connection), so
    # even the background dispatcher logs it before the process exits (the
    # exit waits up to 2 s for queued triggers).
    assert "could not dispatch 1 outbox row(s) (celery); the sweep will run them" in output
    [message] = OutboxMessage.objects.all()
    assert message.state == OutboxState.SHOULD_BE_SENT
    # The sweep (here: a relay's drain) delivers what the lost trigger did not.
    assert Relay().drain().sent == 1
    assert [e.message_id for e in mailbox["default"]] == [message.message_id]
