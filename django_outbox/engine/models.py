"""What every row the engine drives has, and the table of live workers.

A part's model (outgoing message, incoming message, job) inherits
:class:`EngineRow` and adds its own ``state`` field and payload columns; the
engine reads and writes only the fields declared here.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone

from django_outbox.engine.fields import KeptJSONField


class EngineRow(models.Model):
    """Attempts, due time, lease and outcome fields shared by every part's rows."""

    attempts = models.PositiveIntegerField(default=0)
    available_at = models.DateTimeField(default=timezone.now)
    locked_until = models.DateTimeField(null=True, blank=True)
    lock_token = models.UUIDField(null=True, blank=True, help_text="Fencing token of the lease.")
    claimed_by = models.UUIDField(
        null=True, blank=True, help_text="The worker that holds (or last held) the lease."
    )
    #: Set when an attempt starts (the step began on the row) and cleared when its
    #: outcome is recorded. A running row without it was claimed but not started.
    attempt_open = models.BooleanField(
        default=False,
        db_default=False,
        help_text="An attempt started and has not recorded how it ended.",
    )
    #: The last attempt ended without an outcome (its worker died during it): the row
    #: runs alone next time, so a row that kills its worker takes no other row down.
    unclean_end = models.BooleanField(
        default=False,
        db_default=False,
        help_text="The last attempt ended with its worker dying: it runs alone next time.",
    )
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    def get_deferred_fields(self) -> set[str]:
        """Django's deferred fields, less those whose text a claim kept: they are
        decoded from it when read (:class:`KeptJSONField`), never loaded again."""
        deferred: set[str] = super().get_deferred_fields()
        if deferred:
            data, get_field = self.__dict__, self._meta.get_field
            deferred = {
                name
                for name in deferred
                if name + "_json" not in data or not isinstance(get_field(name), KeptJSONField)
            }
        return deferred


class Worker(models.Model):
    """A process that claims rows, alive while its heartbeat is recent.

    Each worker process (``outbox_relay``, ``inbox_worker``, ``inbox_consume``,
    ``jobs_worker``, a Celery worker process) writes ``heartbeat_at`` with the
    database's clock every ``HEARTBEAT_SECONDS``. Rows claimed by a worker whose
    heartbeat is older than ``WORKER_TIMEOUT_SECONDS`` are rescued at once instead of
    after their lease (see ``engine.heartbeat`` for who may judge).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=255, help_text="host:pid and role.")
    started_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(default=timezone.now)
    #: Since when every heartbeat of this worker succeeded (the database's clock). A
    #: worker beating for longer than the timeout proves the database was reachable:
    #: a worker silent all that time is dead (or cut off), not waiting out an outage.
    healthy_since = models.DateTimeField(default=timezone.now)
    #: The attempts this worker has started and not recorded yet: the lease they run
    #: under, the rows (ids, comma-separated) and when the last of them started. One
    #: small write per window of starts, instead of one per row: a rescuer reads here
    #: which of a dead worker's rows had started (counted, uncertain) and which had not
    #: (given back uncounted).
    attempt_token = models.UUIDField(null=True, blank=True)
    attempt_ids = models.TextField(blank=True, default="")
    attempt_started_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "django_outbox"
        db_table = "django_outbox_worker"
        indexes = (models.Index(fields=("heartbeat_at",), name="outbox_worker_heartbeat_idx"),)

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"


class SweepMark(models.Model):
    """When the lease sweep of a part last ran, and where: shows whether sweeps run at all.

    Triggers can be lost (a broker down at commit, a process killed before
    its dispatcher thread ran) and leases can expire; only a sweep recovers
    those rows. Celery beat's sweep tasks, the ``*_sweep`` commands, the worker
    commands' timers and ``inbox_consume``'s idle drains stamp this row of their
    part on every pass; workers and the admin warn when it is older
    than ``SWEEP_STALE_SECONDS`` while the part has unfinished rows.
    """

    part = models.CharField(max_length=32, primary_key=True)
    last_run_at = models.DateTimeField()
    ran_by = models.CharField(max_length=255, help_text="host:pid of the process.")

    class Meta:
        app_label = "django_outbox"
        db_table = "django_outbox_sweep"

    def __str__(self) -> str:
        return f"{self.part} swept at {self.last_run_at:%Y-%m-%d %H:%M:%S}"


class MinuteCount(models.Model):
    """How many rows of a part reached an outcome in one minute: the health page's chart.

    Workers count outcomes in memory (``engine.telemetry``) and add them here once
    every ``FLUSH_SECONDS`` or so (one upsert per part and event, never one per row);
    rows older than ``KEEP_MINUTES`` are deleted by the same flush. ``event`` is one
    of ``telemetry.EVENTS`` (``done``, ``retried``, ``dead``, ``rescued``...).
    """

    part = models.CharField(max_length=32)
    minute = models.DateTimeField(help_text="The minute's start (UTC, seconds zero).")
    event = models.CharField(max_length=32)
    count = models.BigIntegerField(default=0)

    class Meta:
        app_label = "django_outbox"
        db_table = "django_outbox_minute_count"
        constraints = (
            models.UniqueConstraint(
                fields=("part", "minute", "event"), name="outbox_minute_count_unique"
            ),
        )

    def __str__(self) -> str:
        return f"{self.part} {self.event} {self.minute:%H:%M}: {self.count}"
