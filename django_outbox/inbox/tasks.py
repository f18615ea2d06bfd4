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

With ``requeue_on_database_error=True`` (an option of the decorator), a task
that cannot reach its database gives its delivery back to the broker
(``give_back_on_database_error``) instead of failing: with ``acks_late``,
Celery acknowledges a task that raised, and the delivery would be lost.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Reject
from django.db import DatabaseError, DataError, IntegrityError, connections, router, transaction

from django_outbox.engine import clock
from django_outbox.inbox.api import claim_id
from django_outbox.inbox.models import InboxMessage, InboxState

logger = logging.getLogger("django_outbox.inbox")

#: The inbox source of task records.
TASK_SOURCE = "celery-task"

#: Seconds a task waits before it gives a delivery back because the database failed:
#: the broker hands the delivery straight back, and the pause keeps a worker from
#: spinning on it while the database is away.
GIVE_BACK_PAUSE_SECONDS = 1.0


@contextmanager
def give_back_on_database_error(what: str) -> Iterator[None]:
    """Turn a database error raised inside into ``Reject(requeue=True)``, after a pause:
    the broker keeps the delivery and gives it out again. For ``acks_late`` tasks that
    must not lose their message, since Celery acknowledges a task that raised
    (``task_acks_on_failure_or_timeout``, on by default).

    Not for ``DataError`` and ``IntegrityError``: those say the message's values are
    refused, and would be refused again on every delivery.
    """
    try:
        yield
    except DatabaseError as exc:
        if isinstance(exc, (DataError, IntegrityError)):
            raise
        logger.warning(
            "%s failed (%s: %s); the delivery goes back to the queue",
            what,
            type(exc).__name__,
            str(exc).strip(),
        )
        connections.close_all()
        time.sleep(GIVE_BACK_PAUSE_SECONDS)
        raise Reject(exc, requeue=True) from exc


class IdempotentTask(Task):  # type: ignore[type-arg]
    """A Celery task base class: one run per task id, in one transaction with its record."""

    #: The database of the record (and of the transaction around the task body).
    using: str | None = None
    #: Give the delivery back to the broker when the database fails (for ``acks_late``).
    requeue_on_database_error: bool = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        task_id = getattr(self.request, "id", None)
        if not task_id:
            return super().__call__(*args, **kwargs)
        using = self.using or router.db_for_write(InboxMessage)
        # The give-back wraps the transaction: it acts once everything is rolled back.
        give_back = (
            give_back_on_database_error(f"task {self.name}[{task_id}]")
            if self.requeue_on_database_error
            else nullcontext()
        )
        with give_back, transaction.atomic(using=using):
            if not record_once(self.name, task_id, args, kwargs, using=using):
                logger.info("task %s[%s] already ran: this run does nothing", self.name, task_id)
                return None
            return super().__call__(*args, **kwargs)


def record_once(name: str, task_id: str, args: Any, kwargs: Any, *, using: str) -> bool:
    """Store the record of task *task_id*; ``False`` if it is stored already."""
    payload = json.loads(json.dumps({"args": args, "kwargs": kwargs}, default=repr))
    if not claim_id(using, TASK_SOURCE, str(task_id)[:255]):
        return False
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
