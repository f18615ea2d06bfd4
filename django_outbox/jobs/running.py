"""Running jobs: the jobs part for the engine, in lease mode.

The engine claims a batch of due jobs (``READY`` → ``RUNNING`` under a
lease, stamped with this worker's id) in one statement; this step runs them
one after the other, outside any transaction of ours (a job's code opens its
own), and hands back the outcomes in groups, which the engine records in a
few UPDATEs: return values, errors, backoff, dead-lettering. Heartbeats keep
a live worker's leases renewed however long a job takes, and give a dead
worker's jobs back within seconds (they run again: jobs are at-least-once).
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, models
from django.utils import timezone

from django_outbox import signals
from django_outbox.engine import clock, heartbeat, triggers
from django_outbox.engine.part import KeyOrdering, Outcomes, Part, register
from django_outbox.engine.runner import Runner, RunResult
from django_outbox.exceptions import DeliveryError, PermanentError, RetryableError
from django_outbox.jobs.models import JOB_LIFECYCLE, Job, JobKey, JobState
from django_outbox.jobs.timeouts import time_limit

logger = logging.getLogger("django_outbox.jobs")

#: The Celery task an on-commit trigger of a job sends.
RUN_TASK = "django_outbox.tasks.run_jobs"
#: A group of outcomes is recorded when it has this many jobs…
GROUP_SIZE = 200
#: …or when its first job started this long ago (seconds).
GROUP_SECONDS = 0.2
#: A batch stops starting jobs after this long; the rest go back for other workers.
BATCH_SECONDS = 2.0
#: Exception class path recorded for an attempt whose worker died.
WORKER_LOST = "django_outbox.jobs.WorkerLost"


class JobFailed(DeliveryError):
    """A job raised; carries the error entry recorded for the attempt."""

    def __init__(self, text: str, entry: Mapping[str, Any]) -> None:
        super().__init__(text)
        self.entry = entry


class JobWillRetry(JobFailed, RetryableError):
    """The job raised an exception it retries (while attempts are left)."""


class JobFailedForGood(JobFailed, PermanentError):
    """The job raised an exception it does not retry, or could not run at all."""


class Running(Part):
    """The jobs part: due jobs of some queues, run by their task function."""

    name = "jobs"
    model = Job
    lifecycle = JOB_LIFECYCLE
    extends_leases = True
    ordering = KeyOrdering(
        key_fields=("serial_key",),
        sequence_field="sequence",
        blocking_states=(JobState.READY, JobState.RUNNING),
        counter=JobKey,
        flag_blocks=True,
    )

    def __init__(self, *, queues: Sequence[str] | None = None, **options: Any) -> None:
        super().__init__(**options)
        #: Queues this runner takes jobs from (``None``: every queue).
        self.queues = list(queues) if queues else None
        self.worker = str(heartbeat.current_worker_id() or _process_name())
        self._started: dict[Any, datetime] = {}
        self._values: dict[Any, Any] = {}

    def due(self) -> models.QuerySet[Any]:
        due = Job.objects.using(self.using).filter(
            state=JobState.READY, available_at__lte=self.now(), blocked=False
        )
        if self.queues is not None:
            due = due.filter(queue_name__in=self.queues)
        return due.order_by("-priority", "available_at", "pk")

    def claim_variant(self) -> Any:
        return tuple(sorted(self.queues)) if self.queues is not None else None

    def max_attempts(self, row: Any) -> int:
        return int(row.max_attempts)

    def retry_delays(self, row: Any) -> tuple[float, float]:
        task = _task_or_none(row.task_path)
        base = getattr(task, "retry_base_seconds", None)
        maximum = getattr(task, "retry_max_seconds", None)
        return (
            self.config.retry_base_seconds if base is None else float(base),
            self.config.retry_max_seconds if maximum is None else float(maximum),
        )

    # -- the step ----------------------------------------------------------------

    def process(self, rows: Sequence[Any], deadline: float) -> Iterator[Outcomes]:
        """Run *rows* in priority order; yield outcomes in groups (recorded at once).

        Stops starting jobs after ``BATCH_SECONDS`` (or at the lease deadline):
        the jobs not started go back, unattempted, for any worker to take.
        """
        ordered = in_running_order(rows)
        self.worker = str(heartbeat.current_worker_id() or _process_name())
        started = time.monotonic()
        stop_at = min(deadline, started + BATCH_SECONDS)
        group: Outcomes = {}
        group_started = started
        failed_keys: set[str] = set()
        for index, row in enumerate(ordered):
            now = time.monotonic()
            if index and now >= stop_at:
                break
            if row.serial_key is not None and row.serial_key in failed_keys:
                continue  # behind a failed job of its key: goes back, unattempted
            if group and now - group_started >= GROUP_SECONDS:
                yield group
                group = {}
            if not group:
                group_started = now
                group_time = timezone.now()
            self._started[row.pk] = group_time
            group[row.pk] = outcome = self.run_one(row)
            if outcome is not None and row.serial_key is not None:
                failed_keys.add(row.serial_key)
            if len(group) >= GROUP_SIZE:
                yield group
                group = {}
        if group:
            yield group

    def run_one(self, row: Job) -> JobFailed | None:
        """Run one job; ``None`` when it returned, else the failure to record."""
        from django_outbox.jobs.backend import check_json, load_task, to_result

        try:
            task = load_task(row.task_path)
        except Exception as exc:
            return self._failed(row, exc, retry=False)
        result = to_result(row, task=task)
        # What the job sees: RUNNING, this attempt counted (TaskContext.attempt).
        from django_outbox.jobs import compat

        compat.set_attribute(result, "status", compat.TaskResultStatus.RUNNING)
        compat.set_attribute(result, "worker_ids", self._worker_ids(row))
        compat.set_attribute(result, "started_at", row.started_at or self._started[row.pk])
        compat.set_attribute(result, "last_attempted_at", self._started[row.pk])
        _send_task_signal("task_started", result)
        try:
            with time_limit(
                getattr(task, "timeout", None), f"job {row.result_id} ({row.task_path})"
            ):
                if task.takes_context:
                    context = compat.TaskContext(task_result=result)
                    value = task.call(context, *row.args, **row.kwargs)
                else:
                    value = task.call(*row.args, **row.kwargs)
            check_json(value, f"the return value of {row.task_path}", "value")
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            # A job interrupted in a query (a timeout) may leave its connection broken.
            connections[self.using].close_if_unusable_or_obsolete()
            retry = task.retries(exc) if hasattr(task, "retries") else isinstance(exc, Exception)
            failure = self._failed(row, exc, retry=retry)
            compat.set_attribute(result, "status", compat.TaskResultStatus.FAILED)
            _send_task_signal("task_finished", result)
            return failure
        self._values[row.pk] = value
        compat.set_attribute(result, "status", compat.TaskResultStatus.SUCCESSFUL)
        compat.set_attribute(result, "_return_value", value)
        _send_task_signal("task_finished", result)
        return None

    def _failed(self, row: Job, exc: BaseException, *, retry: bool) -> JobFailed:
        kind = type(exc)
        entry = {
            "exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
            "traceback": "".join(traceback.format_exception(exc)),
            "attempt": row.attempts,
            "worker_id": self.worker,
        }
        text = f"{kind.__name__}: {exc}" if str(exc) else kind.__name__
        return (JobWillRetry if retry else JobFailedForGood)(text, entry)

    # -- what is recorded ----------------------------------------------------------

    def _worker_ids(self, row: Job) -> list[str]:
        """One entry per attempt, this one included; attempts whose worker died are
        marked as lost (their worker was not recorded)."""
        known = [str(w) for w in row.worker_ids or []]
        lost = max(row.attempts - 1 - len(known), 0)
        return known + ["(lost)"] * lost + [self.worker]

    def _errors(self, row: Job, entry: Mapping[str, Any] | None) -> list[Any]:
        errors = list(row.errors or [])
        recorded = len(row.worker_ids or [])
        for attempt in range(recorded + 1, row.attempts):
            errors.append(
                {
                    "exception_class_path": WORKER_LOST,
                    "traceback": f"attempt {attempt}: the worker running it stopped before "
                    "recording an outcome (killed, or lost its database); the job ran again",
                    "attempt": attempt,
                    "worker_id": "(lost)",
                }
            )
        if entry is not None:
            errors.append(dict(entry))
        return errors

    def _attempt_values(self, row: Job, entry: Mapping[str, Any] | None) -> dict[str, Any]:
        started = self._started.pop(row.pk, None) or timezone.now()
        values: dict[str, Any] = {
            "worker_ids": self._worker_ids(row),
            "last_attempted_at": started,
        }
        if row.started_at is None:
            values["started_at"] = started
        errors = self._errors(row, entry)
        if errors != (row.errors or []):
            values["errors"] = errors
        return values

    def done_values(self, now: clock.Instant) -> Mapping[str, Any]:
        return {"finished_at": now, "last_error": ""}

    def done_row_values(self, row: Any, now: clock.Instant) -> Mapping[str, Any]:
        value = self._values.pop(row.pk, None)
        return {"return_value": value, **self._attempt_values(row, None)}

    def failed_values(self, row: Any, error: DeliveryError) -> Mapping[str, Any]:
        entry = error.entry if isinstance(error, JobFailed) else None
        return self._attempt_values(row, entry)

    def dead_values(self, row: Any, now: clock.Instant) -> Mapping[str, Any]:
        return {"finished_at": now}

    def held_values(self) -> Mapping[str, Any]:
        # A job whose workers kept dying until its attempts ran out ends FAILED.
        return {"finished_at": clock.now()}

    # -- hooks ---------------------------------------------------------------------

    def maintain(self) -> None:
        from django_outbox.jobs import batches

        batches.sweep(self.using)

    def on_done(self, rows: Sequence[Any]) -> None:
        self.logger.info("ran %d job(s)", len(rows))
        signals.emit(signals.jobs_finished, sender=Running, jobs=list(rows))
        self._complete_batches(rows)

    def _complete_batches(self, rows: Sequence[Any]) -> None:
        from django_outbox.jobs import batches

        touched = {row.batch_id for row in rows if row.batch_id is not None}
        if touched:
            try:
                batches.complete(self.using, touched)
            except Exception:
                # Recorded all the same; the sweep completes the batch.
                self.logger.exception("completing batches %s failed; the sweep will", touched)

    def on_failed(self, row: Any, error: str, will_retry: bool) -> None:
        outcome = "will retry" if will_retry else "FAILED"
        self.logger.warning(
            "job %s (%s) attempt %d failed, %s: %s",
            row.result_id,
            row.task_path,
            row.attempts,
            outcome,
            error,
        )
        signals.emit(
            signals.job_failed, sender=Running, job=row, error=error, will_retry=will_retry
        )
        if not will_retry:
            self._complete_batches([row])


register(Running)


def in_running_order(rows: Sequence[Job]) -> list[Job]:
    """*rows* by priority (highest first), then due time; the jobs of one serial key
    keep their sequence order among the places their key takes."""
    ordered = sorted(rows, key=lambda r: (-r.priority, r.available_at, r.pk))
    by_key: dict[str, list[Job]] = {}
    for row in ordered:
        if row.serial_key is not None:
            by_key.setdefault(row.serial_key, []).append(row)
    queues = {
        key: iter(sorted(keyed, key=lambda r: r.sequence or 0)) for key, keyed in by_key.items()
    }
    return [next(queues[r.serial_key]) if r.serial_key is not None else r for r in ordered]


def _route(queue: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A job trigger's Celery routing: the job's queue picks the Celery queue."""
    from django_outbox.conf import get_settings

    queue = queue or "default"
    mapping = get_settings().jobs_celery_queues
    celery_queue = mapping.get(queue, None if queue == "default" else queue)
    options = {"queue": celery_queue} if celery_queue else {}
    return {"queue": queue}, options


triggers.register_task(Running.name, RUN_TASK, route=_route)


class Jobs(Runner):
    """Runs due jobs: ``Jobs(queues=["default"]).drain()``, ``.deliver(ids)``."""

    def __init__(
        self,
        *,
        using: str | None = None,
        queues: Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(Running(using=using or DEFAULT_DB_ALIAS, queues=queues, **options))

    def _more(self, result: RunResult) -> bool:
        # A batch cut short by BATCH_SECONDS released rows that are still due.
        return result.claimed >= self.batch_size or result.released > 0


def _process_name() -> str:
    import os
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


_TASKS: dict[str, Any] = {}


def _task_or_none(path: str) -> Any:
    from django_outbox.jobs.backend import load_task

    if path not in _TASKS:
        try:
            _TASKS[path] = load_task(path)
        except Exception:
            _TASKS[path] = None
    return _TASKS[path]


def _send_task_signal(name: str, result: Any) -> None:
    """Django's ``task_started`` / ``task_finished``, as its own backends send them."""
    from django_outbox.jobs import compat

    try:
        getattr(compat.signals, name).send(sender=Running, task_result=result)
    except Exception:
        logger.exception("a %s receiver raised", name)


__all__ = ["JobFailed", "Jobs", "Running"]
