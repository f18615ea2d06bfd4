"""Idempotent Celery tasks: the task's effects and a record of its task id commit
together, so a redelivery (``acks_late``, a worker lost mid-task) or a second send
with the same task id does nothing the second time::

    from django_outbox.inbox.tasks import idempotent_task

    @idempotent_task(acks_late=True)
    def capture_payment(order_id):
        Order.objects.filter(pk=order_id).update(paid=True)

The record is an inbox row (source ``celery-task``, the task id as message
id, the task name as type) stored ``handled``, so the deduplication window
is the inbox's retention, and the admin shows what ran. The task body runs
inside that transaction: if it raises, the record is rolled back with its
effects and a retry runs it again. Tasks called without a task id (directly,
as a function) run every time.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from celery import Task, shared_task
from django.db import IntegrityError, router, transaction

from django_outbox.engine import clock
from django_outbox.inbox.models import InboxMessage, InboxState

logger = logging.getLogger("django_outbox.inbox")

#: The inbox source of task records.
TASK_SOURCE = "celery-task"


class IdempotentTask(Task):  # type: ignore[type-arg]
    """A Celery task base class: one run per task id, in one transaction with its record."""

    #: The database of the record (and of the transaction around the task body).
    using: str | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        task_id = getattr(self.request, "id", None)
        if not task_id:
            return super().__call__(*args, **kwargs)
        using = self.using or router.db_for_write(InboxMessage)
        with transaction.atomic(using=using):
            if not record_once(self.name, task_id, args, kwargs, using=using):
                logger.info("task %s[%s] already ran: this run does nothing", self.name, task_id)
                return None
            return super().__call__(*args, **kwargs)


def record_once(name: str, task_id: str, args: Any, kwargs: Any, *, using: str) -> bool:
    """Store the record of task *task_id*; ``False`` if it is stored already."""
    payload = json.loads(json.dumps({"args": args, "kwargs": kwargs}, default=repr))
    try:
        with transaction.atomic(using=using):
            InboxMessage.objects.using(using).create(
                source=TASK_SOURCE,
                message_id=str(task_id)[:255],
                type=name[:255],
                payload=payload,
                state=InboxState.HANDLED,
                attempts=1,
                created_at=clock.now(),
                available_at=clock.now(),
                finished_at=clock.now(),
            )
    except IntegrityError:
        exists = InboxMessage.objects.using(using).filter(
            source=TASK_SOURCE, message_id=str(task_id)[:255]
        )
        if exists.exists():
            return False
        raise
    return True


def idempotent_task(*args: Any, **options: Any) -> Any:
    """``shared_task`` with :class:`IdempotentTask` as its base (same arguments)."""
    options.setdefault("base", IdempotentTask)
    return shared_task(*args, **options)
