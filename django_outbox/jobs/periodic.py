"""Periodic jobs on Celery beat: a beat entry that enqueues a ``django.tasks`` task
through our backend.

::

    from celery.schedules import crontab
    from django_outbox.jobs.periodic import periodic

    app.conf.beat_schedule = {
        **OUTBOX_BEAT_SCHEDULE,
        "nightly-report": periodic(reports.nightly, crontab(hour=3, minute=0), kwargs={"x": 1}),
    }

Each tick is a Celery message to ``django_outbox.enqueue_job``, an
idempotent task run with ``acks_late``: the job is enqueued in one
transaction with the record of the tick's task id, so a tick whose worker
died is delivered again and enqueues its job then, and a tick delivered twice
enqueues it once. From then on it is a job like any other (retries, results,
the admin). Beat itself must run (one beat per project); a tick beat never
sent (beat down) is not made up afterwards, as with any beat schedule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ENQUEUE_TASK = "django_outbox.enqueue_job"


def periodic(
    task: Any,
    schedule: Any,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A Celery beat entry that enqueues *task* (a ``@task`` function, or its dotted
    path) on *schedule* (seconds, a ``timedelta`` or a ``crontab``) with *args* and
    *kwargs*, which must be plain JSON. *options* are Celery's ``apply_async`` options
    of the tick. Safe to call in a Celery app module, before Django is set up."""
    from django_outbox.jobs.backend import check_json

    path: Any = task if isinstance(task, str) else getattr(task, "module_path", None)
    if not isinstance(path, str) or not (isinstance(task, str) or hasattr(task, "enqueue")):
        raise TypeError(f"periodic() takes a task (decorated with @task), got {task!r}")
    check_json(list(args), f"arguments of periodic {path}", "args")
    check_json(dict(kwargs or {}), f"arguments of periodic {path}", "kwargs")
    return {
        "task": ENQUEUE_TASK,
        "schedule": schedule,
        "args": (path, list(args), dict(kwargs or {})),
        "options": dict(options or {}),
    }


__all__ = ["ENQUEUE_TASK", "periodic"]
