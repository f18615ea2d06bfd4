"""Celery tasks: thin wrappers over the relay and the maintenance sweeps.

Task names are stable and public (beat schedules and ``task_routes`` refer
to them). A worker process that runs them keeps a heartbeat, so if it dies
the rows it held are rescued within seconds (see ``engine.heartbeat``).

Acknowledgement: the tasks that carry something found nowhere else, the
incoming message of ``django_outbox.receive`` and the beat tick of
``enqueue_job``, are acknowledged only after they ran (``acks_late``) and
go back to the queue when their worker process dies
(``reject_on_worker_lost``); both are idempotent, by (source, message id)
and by the tick's task id. The others keep Celery's default and are
acknowledged as they start: their work is in the database already (the
rows of an on-commit trigger, a sweep's due rows), so a lost one costs a
delay until the next sweep, never a message, and a row that kills its worker
comes back at the sweep's pace, not redelivered at once, forever.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Task, shared_task
from celery.signals import worker_process_init, worker_process_shutdown
from django.db import DEFAULT_DB_ALIAS, DatabaseError

from django_outbox.engine import heartbeat, triggers
from django_outbox.engine.runner import Runner
from django_outbox.inbox.tasks import idempotent_task

logger = logging.getLogger("django_outbox.heartbeat")


def _in_a_worker(task: Task) -> None:  # type: ignore[type-arg]
    """Start this worker process's heartbeat (not for eager or direct calls)."""
    heartbeat.start_for_task(task.request)


@worker_process_init.connect(weak=False)
def _beat_from_the_start(**kwargs: Any) -> None:
    """Every worker process of a Celery app that has our tasks beats from its start, not
    from its first task of ours: a live process is then ready to judge a dead one as
    soon as the timeout allows (a dead process's jobs run again within seconds), and
    its claims always carry its id. A database away at that moment is not fatal: the
    first task of ours starts the heartbeat instead."""
    try:
        heartbeat.start("celery")
    except DatabaseError:
        logger.warning("no heartbeat at this worker process's start (the database is away)")


@worker_process_shutdown.connect(weak=False)
def _stop_beating(pid: int | None = None, **kwargs: Any) -> None:
    """A worker process that exits cleanly leaves nothing to rescue (its last counts
    are flushed by the heartbeat's stop), and its live Prometheus gauges go with it."""
    heartbeat.stop()
    from django_outbox import metrics

    metrics.process_exited(pid or os.getpid())


def _drain(runner: Runner, trigger: str) -> dict[str, int]:
    """A trigger's task: drain what is due, the trigger's rows among it. A drain
    that ran out of its budget with rows still due sends the trigger again, so the work
    goes on in the next task rather than waiting for the next sweep.

    The ids only say that rows committed. The drain's first claim takes a batch of due
    rows in claim order: the trigger's, and those of transactions whose triggers are
    still on their way (in a process's coalescing window, or queued behind this task),
    which then find little or nothing left. Claiming the trigger's own rows first
    (``Runner.deliver``) cost a batch cycle of their own before the drain's, and each
    trigger a claim: at 300 commits a second the solo worker's queue, not the work,
    set the latency."""
    result = runner.drain()
    if runner.cut_short:
        triggers.dispatch(trigger, runner.using, [])
    return result.as_dict()


@shared_task(name="django_outbox.deliver_messages", ignore_result=True, bind=True)
def deliver_messages(self: Task, ids: list[int], using: str = DEFAULT_DB_ALIAS) -> dict[str, int]:  # type: ignore[type-arg]
    """On-commit trigger of ``send()``: publish what is due, *ids* among it."""
    from django_outbox.outbox.relay import Relay

    _in_a_worker(self)
    return _drain(Relay(using=using), "outbox")


@shared_task(name="django_outbox.sweep_outbox", ignore_result=True, bind=True)
def sweep_outbox(self: Task, using: str = DEFAULT_DB_ALIAS) -> dict[str, Any]:  # type: ignore[type-arg]
    """Beat: rescue expired leases and dead workers' rows, then deliver everything due."""
    from django_outbox.outbox.maintenance import sweep

    _in_a_worker(self)
    return sweep(using=using)


@shared_task(name="django_outbox.purge_outbox", ignore_result=True)
def purge_outbox(using: str = DEFAULT_DB_ALIAS) -> int:
    """Beat: delete finished messages older than ``RETENTION_DAYS``."""
    from django_outbox.outbox.maintenance import purge_finished_messages

    return purge_finished_messages(using=using)


@shared_task(name="django_outbox.handle_inbox", ignore_result=True, bind=True)
def handle_inbox(self: Task, ids: list[int], using: str = DEFAULT_DB_ALIAS) -> dict[str, int]:  # type: ignore[type-arg]
    """On-commit trigger of ``receive()``: handle what is due, *ids* among it."""
    from django_outbox.inbox.handling import Inbox

    _in_a_worker(self)
    return _drain(Inbox(using=using), "inbox")


@shared_task(name="django_outbox.sweep_inbox", ignore_result=True, bind=True)
def sweep_inbox(self: Task, using: str = DEFAULT_DB_ALIAS) -> dict[str, Any]:  # type: ignore[type-arg]
    """Beat: handle every due inbox message whose trigger was lost or whose retry is due."""
    from django_outbox.inbox.maintenance import sweep

    _in_a_worker(self)
    return sweep(using=using)


@shared_task(name="django_outbox.purge_inbox", ignore_result=True)
def purge_inbox(using: str = DEFAULT_DB_ALIAS) -> int:
    """Beat: delete handled and skipped messages older than the inbox's ``RETENTION_DAYS``
    (the deduplication window)."""
    from django_outbox.inbox.maintenance import purge

    return purge(using=using)


@shared_task(name="django_outbox.run_jobs", ignore_result=True, bind=True)
def run_jobs(
    self: Task,  # type: ignore[type-arg]
    ids: list[int],
    using: str = DEFAULT_DB_ALIAS,
    queue: str = "default",
) -> dict[str, int]:
    """On-commit trigger of ``enqueue``: run the jobs due in *queue*, *ids* among them."""
    from django_outbox.jobs.running import Jobs

    _in_a_worker(self)
    return _drain(Jobs(using=using, queues=[queue]), f"jobs:{queue}")


@shared_task(name="django_outbox.sweep_jobs", ignore_result=True, bind=True)
def sweep_jobs(self: Task, using: str = DEFAULT_DB_ALIAS) -> dict[str, Any]:  # type: ignore[type-arg]
    """Beat: rescue jobs whose lease expired or whose worker died, trigger every queue with
    due jobs, complete batches whose last finisher died."""
    from django_outbox.jobs.maintenance import sweep

    _in_a_worker(self)
    return sweep(using=using)


@shared_task(name="django_outbox.purge_jobs", ignore_result=True)
def purge_jobs(using: str = DEFAULT_DB_ALIAS) -> int:
    """Beat: delete finished jobs older than the jobs' ``RETENTION_DAYS``."""
    from django_outbox.jobs.maintenance import purge

    return purge(using=using)


@idempotent_task(  # type: ignore[untyped-decorator]
    name="django_outbox.enqueue_job",
    acks_late=True,
    reject_on_worker_lost=True,
    requeue_on_database_error=True,
    ignore_result=True,
)
def enqueue_job(path: str, args: list[Any], kwargs: dict[str, Any]) -> str:
    """Beat's tick of a periodic job (``django_outbox.jobs.periodic``): enqueue the task
    at *path*, once per tick (the tick's task id is recorded with the job). Acknowledged
    once the job is enqueued: a tick whose worker process died, or that met a database
    it could not reach, is delivered again; nothing else would send it."""
    from django_outbox.jobs.backend import load_task

    result = load_task(path).enqueue(*args, **kwargs)
    return str(result.id)


# The task other services' outboxes call to deliver into this inbox (registered here
# so that a worker that imports django_outbox.tasks has it).
from django_outbox.inbox.consumers.celery import receive_task  # noqa: E402

__all__ = [
    "deliver_messages",
    "enqueue_job",
    "handle_inbox",
    "purge_inbox",
    "purge_jobs",
    "purge_outbox",
    "receive_task",
    "run_jobs",
    "sweep_inbox",
    "sweep_jobs",
    "sweep_outbox",
]
