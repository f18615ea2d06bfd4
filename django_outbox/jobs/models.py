"""Background jobs: the job table.

A job row is a ``django.tasks`` task result that lives in the database. Its
``state`` holds Django's own statuses (``READY``, ``RUNNING``,
``SUCCESSFUL``, ``FAILED``); how they map onto the engine's roles (claim,
lease, backoff, dead-letter, purge) is said once, in ``JOB_LIFECYCLE``.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Q

from django_outbox.engine import clock
from django_outbox.engine.models import EngineRow
from django_outbox.engine.part import Lifecycle


class JobState(models.TextChoices):
    """Django's task statuses, stored as Django names them."""

    READY = "READY", "Ready"
    RUNNING = "RUNNING", "Running"
    SUCCESSFUL = "SUCCESSFUL", "Successful"
    FAILED = "FAILED", "Failed"


#: The one place where Django's statuses meet the engine's roles:
#: READY is claimable (``available_at`` is ``run_after`` or the next retry),
#: RUNNING is held under a lease by a live worker, SUCCESSFUL is done,
#: FAILED is dead-lettered (retries used up, a non-retried exception, a
#: cancelled job); both final states are purged after ``RETENTION_DAYS``.
JOB_LIFECYCLE = Lifecycle(
    ready=JobState.READY,
    running=JobState.RUNNING,
    done=JobState.SUCCESSFUL,
    failed=JobState.FAILED,
    finished=(JobState.SUCCESSFUL, JobState.FAILED),
)

ACTIVE_STATES = (JobState.READY, JobState.RUNNING)


class Resolution(models.TextChoices):
    """Why a job ended FAILED without failing (an operator's decision)."""

    NONE = "", "-"
    CANCELLED = "cancelled", "cancelled"


class JobQuerySet(models.QuerySet["Job"]):
    """Selections and operator transitions over jobs."""

    def due(self, now: datetime | None = None) -> JobQuerySet:
        """READY jobs whose ``available_at`` has passed (database clock unless pinned)."""
        return self.filter(state=JobState.READY, available_at__lte=clock.now(now))

    def retry(self, now: datetime | None = None) -> int:
        """Run FAILED jobs again: READY now, attempts reset (their history is kept)."""
        return self.filter(state=JobState.FAILED).update(
            state=JobState.READY,
            attempts=0,
            available_at=clock.now(now),
            finished_at=None,
            resolution=Resolution.NONE,
            cancel_requested=False,
            locked_until=None,
            lock_token=None,
            claimed_by=None,
        )

    def cancel(self, now: datetime | None = None) -> int:
        """Cancel READY jobs (they end FAILED, resolution ``cancelled``, and never run);
        ask RUNNING ones to stop (``cancel_requested``: the job decides). Returns how many
        READY jobs were cancelled."""
        self.filter(state=JobState.RUNNING).update(cancel_requested=True)
        return self.filter(state=JobState.READY).update(
            state=JobState.FAILED,
            resolution=Resolution.CANCELLED,
            finished_at=clock.now(now),
            last_error="cancelled before it ran",
            locked_until=None,
            lock_token=None,
            claimed_by=None,
        )


class Job(EngineRow):
    """One enqueued ``django.tasks`` task: its call, its state and its results."""

    id = models.BigAutoField(primary_key=True)
    result_id = models.UUIDField(
        default=uuid.uuid4, unique=True, editable=False, help_text="The TaskResult id."
    )
    task_path = models.CharField(max_length=255, help_text="Dotted path of the task function.")
    backend = models.CharField(max_length=100, default="default")
    queue_name = models.CharField(max_length=100, default="default")
    priority = models.SmallIntegerField(default=0)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    state = models.CharField(
        "status", max_length=10, choices=JobState.choices, default=JobState.READY
    )
    #: Tasks options captured at enqueue time (retries, backoff, unique and serial keys).
    max_attempts = models.PositiveIntegerField(default=1)
    return_value = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    #: One entry per failed attempt: exception class path, traceback, attempt, worker.
    errors = models.JSONField(default=list, blank=True)
    #: One entry per attempt: the worker that ran it.
    worker_ids = models.JSONField(default=list, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    unique_key = models.CharField(  # noqa: DJ001
        max_length=255,
        null=True,
        blank=True,
        help_text="At most one READY or RUNNING job has it.",
    )
    cancel_requested = models.BooleanField(
        default=False, db_default=False, help_text="An operator asked the running job to stop."
    )
    resolution = models.CharField(
        max_length=20, choices=Resolution.choices, default=Resolution.NONE, blank=True
    )

    objects = JobQuerySet.as_manager()

    class Meta:
        app_label = "django_outbox"
        db_table = "django_outbox_job"
        verbose_name = "job"
        ordering = ("-id",)
        permissions = (
            ("retry_job", "Can retry failed jobs"),
            ("cancel_job", "Can cancel jobs"),
        )
        indexes = (
            models.Index(
                fields=("queue_name", "-priority", "available_at", "id"),
                condition=Q(state="READY"),
                name="outbox_job_due_idx",
            ),
            models.Index(
                fields=("locked_until",), condition=Q(state="RUNNING"), name="outbox_job_lease_idx"
            ),
            models.Index(
                fields=("lock_token",), condition=Q(state="RUNNING"), name="outbox_job_token_idx"
            ),
            models.Index(
                fields=("claimed_by",), condition=Q(state="RUNNING"), name="outbox_job_worker_idx"
            ),
            models.Index(
                fields=("finished_at",),
                condition=Q(state__in=("SUCCESSFUL", "FAILED")),
                name="outbox_job_finished_idx",
            ),
            models.Index(fields=("task_path", "state"), name="outbox_job_task_idx"),
        )
        # The unique key of active jobs is a partial unique index created by the
        # migration (0008) on PostgreSQL and SQLite; MySQL/MariaDB have no partial
        # indexes, and there a locking read stands in for it (see backend.py).

    def __str__(self) -> str:
        return f"{self.task_path} [{self.state}] {self.result_id}"
