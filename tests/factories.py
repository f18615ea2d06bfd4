import uuid

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
