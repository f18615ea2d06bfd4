"""Background jobs: the job table.

A job row is a ``django.tasks`` task result that lives in the database. Its
``state`` holds Django's own statuses (``READY``, ``RUNNING``,
``SUCCESSFUL``, ``FAILED``); how they map onto the engine's roles (claim,
lease, backoff, dead-letter, purge) is said once, in ``JOB_LIFECYCLE``.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Q
from django.utils import timezone

from django_outbox.engine import clock, operator
from django_outbox.engine.ids import uuid7
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
    SKIPPED = "skipped", "skipped"


class JobQuerySet(models.QuerySet["Job"]):
    """Operator actions over jobs (the engine's, see ``engine.operator``). The workers'
    selection of due jobs is the engine's too: ``Running(queues=...).due()``."""

    def retry(self, now: datetime | None = None) -> int:
        """Run FAILED jobs again: READY now, attempts reset (their errors are kept); the
        workers of their queues are triggered once committed. A job whose unique key
        another READY or RUNNING job holds stays FAILED (as does all but the oldest of
        several selected jobs with one key). Returns how many moved."""
        return operator.requeue(self, now=now).count

    def skip(self, now: datetime | None = None) -> int:
        """Give up on FAILED jobs for good: they stay FAILED (resolution ``skipped``) and
        no longer hold back the later jobs of their serial key. Returns how many moved."""
        return operator.skip(self, now=now).count

    def cancel(self, now: datetime | None = None) -> int:
        """Cancel READY jobs (they end FAILED, resolution ``cancelled``, and never run),
        then ask RUNNING ones to stop (``cancel_requested``: the job decides), in one
        transaction: a job claimed meanwhile is asked. Returns how many READY jobs were
        cancelled."""
        return operator.cancel(self, now=now).count


class Job(EngineRow):
    """One enqueued ``django.tasks`` task: its call, its state and its results."""

    id = models.BigAutoField(primary_key=True)
    result_id = models.UUIDField(
        default=uuid7, unique=True, editable=False, help_text="The TaskResult id."
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
    #: ``run_after`` as enqueued (``available_at`` moves with retries).
    run_after = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    #: The W3C ``traceparent`` of the span current at ``enqueue()`` ("" when none): the
    #: job's run span is linked to it.
    traceparent = models.CharField(max_length=55, blank=True, default="", db_default="")
    unique_key = models.CharField(  # noqa: DJ001
        max_length=255,
        null=True,
        blank=True,
        help_text="At most one READY or RUNNING job has it.",
    )
    serial_key = models.CharField(  # noqa: DJ001
        max_length=255,
        null=True,
        blank=True,
        help_text="Jobs with the same serial key run one at a time, in enqueue order.",
    )
    sequence = models.BigIntegerField(null=True, blank=True, help_text="Position within key.")
    blocked = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Waits behind a failed earlier job of its serial key.",
    )
    blocking = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Failed while later jobs of its serial key wait behind it.",
    )
    batch = models.ForeignKey(
        "JobBatch",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        db_constraint=False,
        db_index=False,  # a partial index below: most jobs have no batch
        related_name="jobs",
        help_text="The batch this job belongs to (its callback runs when all have finished).",
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
            ("skip_job", "Can skip failed jobs (releases their serial key)"),
        )
        indexes = (
            models.Index(
                fields=("queue_name", "-priority", "available_at", "id"),
                condition=Q(state="READY", blocked=False),
                name="outbox_job_due_idx",
            ),
            # The same order for workers of every queue (no queue filter): without
            # it each claim sorted the whole READY backlog.
            models.Index(
                fields=("-priority", "available_at", "id"),
                condition=Q(state="READY", blocked=False),
                name="outbox_job_due_all_idx",
            ),
            models.Index(
                fields=("serial_key", "sequence"),
                condition=Q(serial_key__isnull=False)
                & (Q(state__in=("READY", "RUNNING")) | Q(blocking=True)),
                name="outbox_job_key_open_idx",
            ),
            # The one index over RUNNING jobs. Lookups by lease token or worker (renewals,
            # rescues of a dead worker's jobs) scan it too: RUNNING jobs are at most the
            # workers' claimed batches. Two more, as the outbox has, cost every job two
            # more index entries on its claim for no better plan (migration 0010).
            models.Index(
                fields=("locked_until",), condition=Q(state="RUNNING"), name="outbox_job_lease_idx"
            ),
            models.Index(
                fields=("batch",), condition=Q(batch__isnull=False), name="outbox_job_batch_idx"
            ),
            # Whether a batch still has jobs to run: one probe per finished group, not a
            # recount of the whole batch.
            models.Index(
                fields=("batch", "state"),
                condition=Q(batch__isnull=False, state__in=("READY", "RUNNING")),
                name="outbox_job_batch_active_idx",
            ),
            models.Index(
                fields=("finished_at",),
                condition=Q(state__in=("SUCCESSFUL", "FAILED")),
                name="outbox_job_finished_idx",
            ),
            # jobs_requeue --task, and the admin's search by the start of a task path
            # (pattern_ops: PostgreSQL's LIKE 'prefix%' under any collation; equality
            # too). Migration 0017.
            models.Index(
                fields=("task_path", "state"),
                opclasses=("varchar_pattern_ops", "varchar_pattern_ops"),
                name="outbox_job_task_idx",
            ),
            # The admin's search by unique key, whatever the job's state (the unique index
            # of 0008 holds active jobs only). Not on MySQL/MariaDB: 0008's index on
            # (unique_key, state) serves it there.
            models.Index(
                fields=("unique_key",),
                condition=Q(unique_key__isnull=False),
                name="outbox_job_unique_lookup_idx",
            ),
            # The admin's filters that few rows match (has an error, attempts): the jobs
            # that failed at least once. PostgreSQL and SQLite (0018).
            models.Index(
                fields=("id",),
                condition=Q(attempts__gt=1) | ~Q(last_error=""),
                name="outbox_job_troubled_idx",
            ),
            # The health page's figures (``django_outbox.health``) and the admin's list of
            # failed jobs: the FAILED jobs, newest first, and the jobs parked behind a
            # failed one of their serial key. PostgreSQL and SQLite only (migration 0016).
            models.Index(fields=("id",), condition=Q(state="FAILED"), name="outbox_job_failed_idx"),
            models.Index(
                fields=("serial_key",),
                condition=Q(state="READY", blocked=True),
                name="outbox_job_parked_idx",
            ),
        )
        # The unique key of active jobs is a partial unique index created by the
        # migration (0008) on PostgreSQL and SQLite; MySQL/MariaDB have no partial
        # indexes, and there a locking read stands in for it (see backend.py).

    def __str__(self) -> str:
        return f"{self.task_path} [{self.state}] {self.result_id}"


class JobOperations(operator.Operations):
    """The jobs' operator actions: retry (the engine's requeue, unique keys respected),
    cancel READY jobs into FAILED (and ask RUNNING ones to stop), skip FAILED ones."""

    def values(self, verb: operator.Verb, now: clock.Instant) -> dict[str, Any]:
        if verb is operator.Verb.CANCEL:
            return {"resolution": Resolution.CANCELLED, "last_error": "cancelled before it ran"}
        if verb is operator.Verb.SKIP:
            return {"resolution": Resolution.SKIPPED}
        return {}

    def choose(self, verb: operator.Verb, rows: list[Any], using: str) -> list[Any]:
        if verb is operator.Verb.SKIP:
            # Only jobs that failed: a cancelled or skipped one was given up on already
            # (a skip would relabel it and record a change that changed nothing).
            return [row for row in rows if row.resolution == Resolution.NONE]
        if verb is not operator.Verb.REQUEUE:
            return rows
        # At most one READY or RUNNING job has a unique key: the oldest selected one
        # whose key is free runs again, the rest stay FAILED.
        keys = {row.unique_key for row in rows if row.unique_key is not None}
        taken: set[str | None] = set()
        if keys:
            taken.update(
                Job.objects.using(using)
                .filter(state__in=ACTIVE_STATES, unique_key__in=keys)
                .values_list("unique_key", flat=True)
            )
        chosen = []
        for row in rows:
            if row.unique_key is not None:
                if row.unique_key in taken:
                    continue
                taken.add(row.unique_key)
            chosen.append(row)
        return chosen

    def moved(self, verb: operator.Verb, part: Any, rows: list[Any]) -> int:
        touched = {row.batch_id for row in rows if row.batch_id is not None}
        if verb is operator.Verb.CANCEL and touched:
            # A cancelled job has finished (FAILED): its batch may be complete now.
            from django_outbox.jobs import batches

            batches.complete(part.using, touched)
        return 0


#: What an operator may do to jobs.
JOB_OPERATIONS = operator.declare(
    JobOperations(
        model=Job,
        requeue_word="retry",
        cancel_from=(JobState.READY,),
        cancelled=JobState.FAILED,
        skip_from=(JobState.FAILED,),
        stop_field="cancel_requested",
        trigger_field="queue_name",
        columns=("unique_key", "resolution", "batch"),
    )
)


class JobKey(models.Model):
    """Last sequence number handed out per serial key (and whether the key is parked)."""

    serial_key = models.CharField(max_length=255, unique=True)
    last_sequence = models.BigIntegerField(default=0)
    blocked = models.BooleanField(
        default=False,
        db_default=False,
        help_text="A job of this key failed: new ones are enqueued parked.",
    )

    class Meta:
        app_label = "django_outbox"
        db_table = "django_outbox_job_key"

    def __str__(self) -> str:
        return f"{self.serial_key} @ {self.last_sequence}"


class JobBatch(models.Model):
    """Jobs enqueued together, with a callback job enqueued exactly once when every one
    of them has finished (SUCCESSFUL, or FAILED for good)."""

    id = models.BigAutoField(primary_key=True)
    batch_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    total = models.PositiveIntegerField(default=0)
    callback_path = models.CharField(max_length=255, blank=True, default="")
    callback_kwargs = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    #: Set, with the counts, by the one transaction that enqueues the callback.
    finished_at = models.DateTimeField(null=True, blank=True)
    succeeded = models.PositiveIntegerField(null=True, blank=True)
    failed = models.PositiveIntegerField(null=True, blank=True)
    callback_result_id = models.UUIDField(null=True, blank=True)
    #: Why the callback could not be enqueued (the sweep tries again); empty when fine.
    last_error = models.TextField(blank=True, default="")

    class Meta:
        app_label = "django_outbox"
        db_table = "django_outbox_job_batch"
        verbose_name = "job batch"
        verbose_name_plural = "job batches"
        indexes = (
            models.Index(
                fields=("created_at",),
                condition=Q(finished_at__isnull=True),
                name="outbox_batch_open_idx",
            ),
        )

    def __str__(self) -> str:
        return f"batch {self.batch_id} ({self.total} jobs)"
