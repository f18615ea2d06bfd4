"""Settings and helpers of the conformance suite: two aliases of our backend, a worker
run in this process, and the name of the Tasks API's logger."""

from __future__ import annotations

import time
from typing import Any

import pytest

from django_outbox.jobs import compat
from django_outbox.jobs.running import Jobs

#: Our backend under two aliases, as Django's tests configure several backends; the
#: queue ``other`` is valid on both.
TWO_ALIASES = {
    "default": {"BACKEND": "django_outbox.jobs.JobsBackend", "QUEUES": ["default", "other"]},
    "other": {"BACKEND": "django_outbox.jobs.JobsBackend", "QUEUES": ["default", "other"]},
}

#: The logger of the Tasks API's own signal receivers (``django.tasks`` on Django 6,
#: ``django_tasks`` for the backport): the module's name is the logger's.
TASKS_LOGGER = compat.SOURCE


@pytest.fixture(autouse=True)
def tasks_settings(settings: Any, configure_outbox: Any) -> dict[str, Any]:
    settings.TASKS = {alias: dict(params) for alias, params in TWO_ALIASES.items()}
    # Our defaults for jobs (three attempts), with retries due at once.
    configure_outbox(
        JOBS={"MAX_ATTEMPTS": 3, "RETRY_BASE_SECONDS": 0.01, "RETRY_MAX_SECONDS": 0.01}
    )
    return settings.TASKS


def run_worker(**options: Any) -> Any:
    """Run every due job in this process, as ``jobs_worker`` would."""
    return Jobs(**options).drain()


def run_until_finished(result: Any, *, timeout: float = 10.0) -> Any:
    """Run the worker (retries are backed off) until *result* is finished; refreshed."""
    deadline = time.monotonic() + timeout
    while True:
        run_worker()
        result.refresh()
        if result.is_finished or time.monotonic() > deadline:
            return result
        time.sleep(0.05)
