"""Model registry for the ``django_outbox`` app (models live in their subpackages)."""

from django_outbox.engine.models import MinuteCount, SweepMark, Worker
from django_outbox.health.models import Health
from django_outbox.inbox.models import InboxCursor, InboxMessage, InboxSeen, InboxState
from django_outbox.jobs.models import Job, JobBatch, JobKey, JobState
from django_outbox.outbox.models import OutboxKey, OutboxMessage, OutboxState

__all__ = [
    "Health",
    "InboxCursor",
    "InboxMessage",
    "InboxSeen",
    "InboxState",
    "Job",
    "JobBatch",
    "JobKey",
    "JobState",
    "MinuteCount",
    "OutboxKey",
    "OutboxMessage",
    "OutboxState",
    "SweepMark",
    "Worker",
]
