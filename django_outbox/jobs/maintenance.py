"""The jobs' maintenance: the sweep (rescue, and wake the queues that have due jobs)
and the purge."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.models import Q

from django_outbox.engine import clock, heartbeat, sweeps, triggers
from django_outbox.engine.purge import purge_in_batches
from django_outbox.jobs import batches
from django_outbox.jobs.models import ACTIVE_STATES, Job, JobBatch, JobKey, JobState
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


def purge(
    *,
    using: str = DEFAULT_DB_ALIAS,
    older_than: timedelta | None = None,
    batch_size: int | None = None,
) -> int:
    """Delete SUCCESSFUL and FAILED jobs that finished more than ``RETENTION_DAYS`` (or
    *older_than*) ago, the batches that finished that long ago, and the counters of
    serial keys no job holds any more. Returns how many jobs were deleted."""
    part = Running(using=using)
    age = older_than if older_than is not None else timedelta(days=part.config.retention_days)
    size = batch_size or part.config.purge_batch_size
    deleted = sweeps.purge_finished(part, older_than=age, batch_size=size)
    before = clock.later(clock.now(), -age.total_seconds())
    purge_in_batches(JobBatch.objects.using(using).filter(finished_at__lt=before), batch_size=size)
    purge_idle_keys(using=using, batch_size=size)
    return deleted


def purge_idle_keys(*, using: str = DEFAULT_DB_ALIAS, batch_size: int = 1000) -> int:
    """Delete the counters of serial keys that no READY or RUNNING job uses and no failed
    job holds back: the table stays as large as the keys in use, not every key ever.

    Safe because a key's sequence numbers only order its unfinished jobs: a key used
    again starts at 1 behind nothing. The counter row is locked before the check (an
    enqueue of the key holds it until its commit), so a job enqueued meanwhile is seen
    and its counter kept."""
    keys = JobKey.objects.using(using)
    jobs = Job.objects.using(using)
    open_jobs = Q(state__in=ACTIVE_STATES) | Q(blocking=True)
    deleted = 0
    after = 0
    while True:
        with transaction.atomic(using=using):
            chunk = list(
                keys.filter(pk__gt=after)
                .order_by("pk")
                .select_for_update(skip_locked=True)
                .values_list("pk", "serial_key")[:batch_size]
            )
            if not chunk:
                return deleted
            after = chunk[-1][0]
            names = [name for _, name in chunk]
            busy = set(
                jobs.filter(open_jobs, serial_key__in=names).values_list("serial_key", flat=True)
            )
            idle = [pk for pk, name in chunk if name not in busy]
            deleted += keys.filter(pk__in=idle, blocked=False).delete()[0]
