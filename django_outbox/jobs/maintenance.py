"""The jobs' maintenance: the sweep (rescue, and wake the queues that have due jobs)
and the purge."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from django_outbox.engine import clock, heartbeat, sweeps, triggers
from django_outbox.engine.purge import purge_in_batches
from django_outbox.jobs import batches
from django_outbox.jobs.models import Job, JobBatch, JobState
from django_outbox.jobs.running import Running


def sweep(*, using: str = DEFAULT_DB_ALIAS) -> dict[str, Any]:
    """One pass: rescue RUNNING jobs whose lease expired and the jobs of dead workers
    (proven dead by the heartbeats of live ones), send one trigger per queue that has
    due jobs (a lost trigger, a retry that came due, a ``run_after`` that passed, a
    rescued job), then complete batches whose last finisher died before enqueuing their
    callback (each on its own: one that fails is recorded on its batch and the rest go
    on). Returns what it did."""
    part = Running(using=using)
    rescued = sweeps.rescue_stuck(part)
    from_dead = heartbeat.rescue_dead_workers(using)
    # Blocked jobs wait for their key, not for a worker.
    queues = sorted(
        Job.objects.using(using)
        .filter(state=JobState.READY, blocked=False, available_at__lte=part.now())
        .order_by()
        .values_list("queue_name", flat=True)
        .distinct()
    )
    for queue in queues:
        triggers.dispatch(f"jobs:{queue}", using, [])
    completed = batches.sweep(using)
    return {
        "rescued": rescued.ready + from_dead.get(part.name, 0),
        "held": rescued.held,
        "batches_completed": completed,
        "woken_queues": queues,
    }


def purge(*, using: str = DEFAULT_DB_ALIAS) -> int:
    """Delete SUCCESSFUL and FAILED jobs that finished more than ``RETENTION_DAYS`` ago,
    and the batches that finished that long ago."""
    part = Running(using=using)
    deleted = sweeps.purge_finished(part)
    before = clock.later(clock.now(), -timedelta(days=part.config.retention_days).total_seconds())
    purge_in_batches(
        JobBatch.objects.using(using).filter(finished_at__lt=before),
        batch_size=part.config.purge_batch_size,
    )
    return deleted
