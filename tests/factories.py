import uuid
from datetime import timedelta

import factory
from django.utils import timezone

from django_outbox.outbox.models import OutboxMessage, OutboxState


class OutboxMessageFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = OutboxMessage

    message_id = factory.LazyFunction(uuid.uuid4)
    type = "order.created"
    destination = "default"
    payload = factory.Sequence(lambda n: {"n": n})
    state = OutboxState.SHOULD_BE_SENT
    available_at = factory.LazyFunction(timezone.now)
    created_at = factory.LazyFunction(timezone.now)


DEAD_RELAY_TOKEN = "7e9c9e0e-0000-4000-8000-000000000000"


def leave_sending(message, *, lease_ends_in: float, attempts=None, started=True):
    """Put *message* in ``sending`` under a lease of a relay that is gone,
    ending *lease_ends_in* seconds from now (negative: already expired); *started*:
    whether that relay had begun its attempt (publishing) when it went."""
    changes = {
        "state": OutboxState.SENDING,
        "locked_until": timezone.now() + timedelta(seconds=lease_ends_in),
        "lock_token": DEAD_RELAY_TOKEN,
        "attempt_open": started,
    }
    if attempts is not None:
        changes["attempts"] = attempts
    OutboxMessage.objects.filter(pk=message.pk).update(**changes)
