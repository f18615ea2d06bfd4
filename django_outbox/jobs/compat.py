"""The Tasks API, from Django (6.0+) or from the ``django-tasks`` backport (Django 5.2).

Everything of the Tasks API that the jobs part uses is imported here, once,
under Django's own names, so the rest of the part never asks which one it has.
"""

from __future__ import annotations

from typing import Any

try:
    from django.tasks import (  # type: ignore[import-not-found,import-untyped,unused-ignore]
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        signals,  # type: ignore[import-not-found,import-untyped,unused-ignore]
        task,
        task_backends,
    )
    from django.tasks.backends.base import (  # type: ignore[import-not-found,import-untyped,unused-ignore]
        BaseTaskBackend,
    )
    from django.tasks.base import (  # type: ignore[import-not-found,import-untyped,unused-ignore]
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        TaskError,
    )
    from django.tasks.exceptions import (  # type: ignore[import-not-found,import-untyped,unused-ignore]
        InvalidTask,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )

    SOURCE = "django.tasks"
except ImportError:
    try:
        from django_tasks import (  # type: ignore[no-redef,unused-ignore]
            DEFAULT_TASK_QUEUE_NAME,
            TaskContext,
            TaskResult,
            TaskResultStatus,
            signals,  # type: ignore[no-redef,unused-ignore]
            task,
            task_backends,
        )
        from django_tasks.backends.base import (  # type: ignore[no-redef,unused-ignore]
            BaseTaskBackend,
        )
        from django_tasks.base import (  # type: ignore[no-redef,unused-ignore]
            DEFAULT_TASK_PRIORITY,
            TASK_MAX_PRIORITY,
            TASK_MIN_PRIORITY,
            Task,
            TaskError,
        )
        from django_tasks.exceptions import (  # type: ignore[no-redef,unused-ignore]
            InvalidTaskError as InvalidTask,
        )
        from django_tasks.exceptions import (  # type: ignore[no-redef,unused-ignore]
            TaskResultDoesNotExist,
            TaskResultMismatch,
        )

        SOURCE = "django_tasks"
    except ImportError as exc:  # pragma: no cover - depends on the installed packages
        raise ImportError(
            "django_outbox.jobs needs the Tasks API: Django 6.0 or later, or on Django 5.2 "
            "the backport (pip install 'django-outbox-inbox[tasks-backport]')"
        ) from exc


def set_attribute(result: Any, name: str, value: Any) -> None:
    """Set a field of a frozen ``TaskResult`` (as Django's own backends do)."""
    object.__setattr__(result, name, value)


__all__ = [
    "DEFAULT_TASK_PRIORITY",
    "DEFAULT_TASK_QUEUE_NAME",
    "SOURCE",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "signals",
    "task",
    "task_backends",
]
