"""Background jobs: a ``django.tasks`` backend with the outbox's guarantees.

``TASKS = {"default": {"BACKEND": "django_outbox.jobs.JobsBackend"}}``; see
``docs/jobs.md``. Imports are lazy: Django imports the backend while apps
may still be loading.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_outbox.jobs.backend import (
        JobArgumentsError,
        JobReturnValueError,
        JobsBackend,
        JobTask,
        WorkerLost,
    )

__all__ = [
    "JobArgumentsError",
    "JobReturnValueError",
    "JobTask",
    "JobsBackend",
    "WorkerLost",
    "batch",
    "cancel_requested",
]


def cancel_requested(result_id: Any, *, using: str | None = None) -> bool:
    """Whether an operator asked the job *result_id* to stop (a running job may check
    this between steps and return early; nothing stops it otherwise)."""
    from django.db import router

    from django_outbox.jobs.models import Job

    db = using or router.db_for_read(Job)
    return Job.objects.using(db).filter(result_id=str(result_id), cancel_requested=True).exists()


def batch(on_finish: Any = None, *, using: str | None = None, **kwargs: Any) -> Any:
    """Group the jobs enqueued in a ``with`` block; *on_finish* is enqueued exactly once
    when all have finished, and then runs at least once, like any job (see
    ``django_outbox.jobs.batches``)."""
    from django_outbox.jobs.batches import batch as open_batch

    return open_batch(on_finish, using=using, **kwargs)


def __getattr__(name: str) -> Any:
    if name in ("JobsBackend", "JobTask", "JobArgumentsError", "JobReturnValueError", "WorkerLost"):
        # WorkerLost: the class behind the exception_class_path its errors record.
        from django_outbox.jobs import backend

        return getattr(backend, name)
    raise AttributeError(name)
