"""Model registry for the ``django_outbox`` app (models live in their subpackages)."""

from django_outbox.engine.models import Worker
from django_outbox.outbox.models import OutboxKey, OutboxMessage, OutboxState

__all__ = ["OutboxKey", "OutboxMessage", "OutboxState", "Worker"]
