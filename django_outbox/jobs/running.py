"""Running jobs: the jobs part for the engine, in lease mode.

The engine claims a batch of due jobs (``READY`` → ``RUNNING`` under a
lease, stamped with this worker's id) in one statement; this step runs them
one after the other, outside any transaction of ours (a job's code opens its
own), and hands back the outcomes in groups, which the engine records in a
few UPDATEs: return values, errors, backoff, dead-lettering.

An attempt counts when the job starts, not when it is claimed. Starts are
declared in windows: one statement declares the next few jobs (as many as
``START_WINDOW_SECONDS`` of this worker's recent jobs take, at least one; the
window doubles while jobs are short), so short jobs cost a statement per
window, and a job of a second or more has a window of its own. If the worker
dies, only the jobs of the window in hand were counted: those that had not
started yet were charged an attempt they did not use (at most the window's
size), and every job of that window then runs alone until it has run once
cleanly, so a job that kills its worker is counted exactly and cannot take
others down with it. Jobs of the batch not yet declared go back uncounted.

Heartbeats renew the lease of the job running now however long it takes,
and give the unstarted rest of the batch back to other workers when a job
runs longer than ``HANDBACK_SECONDS``; a dead worker's jobs come back within
seconds (they run again: jobs are at-least-once).
"""

from __future__ import annotations

import copy
import logging
import operator
import time
import traceback
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, models

from django_outbox import metrics, signals, tracing
from django_outbox.engine import clock, faults, heartbeat, triggers
from django_outbox.engine.outcomes import Done, Fail, Outcome, Outcomes, Retry, Uncertain
from django_outbox.engine.part import Attempt, KeyOrdering, Part, register
from django_outbox.engine.runner import Runner, RunResult
from django_outbox.jobs.models import JOB_LIFECYCLE, Job, JobKey, JobState
from django_outbox.jobs.timeouts import call_limited
from django_outbox.validation import storable

logger = logging.getLogger("django_outbox.jobs")

#: The Celery task an on-commit trigger of a job sends.
RUN_TASK = "django_outbox.tasks.run_jobs"
#: A group of outcomes is recorded when it has this many jobs…
GROUP_SIZE = 200
#: …or when its first job started this long ago (seconds).
GROUP_SECONDS = 0.2
#: A batch stops starting jobs after this long; the rest go back for other workers.
BATCH_SECONDS = 2.0
#: A window of declared starts holds about this many seconds of this worker's recent
#: jobs (at least one job, at most ``MAX_WINDOW``).
START_WINDOW_SECONDS = 0.01
MAX_WINDOW = 500
#: The attribute a started job's row keeps its worker ids in, this attempt's included.
ATTEMPT_WORKERS = "_django_outbox_attempt_workers"
#: At most this many tasks as enqueued are kept per runner (``Running._task``).
MAX_TASKS = 1024
#: Exception class path recorded for an attempt whose worker died.
WORKER_LOST = "django_outbox.jobs.WorkerLost"


class Running(Part):
    """The jobs part: due jobs of some queues, run by their task function."""

    name = "jobs"
    sweepers = (
        "Celery beat's django_outbox.sweep_jobs (the documented schedule), or jobs_worker, or "
        "jobs_sweep from cron"
    )
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

    attempted_at_field = "last_attempted_at"
    first_started_field = "started_at"
    hooks_see_recorded_values = True
    has_own_done_values = True

    def __init__(self, *, queues: Sequence[str] | None = None, **options: Any) -> None:
        super().__init__(**options)
        #: Queues this runner takes jobs from (``None``: every queue).
        self.queues = list(queues) if queues else None
        self.worker = str(heartbeat.current_worker_id() or _process_name())
        #: Jobs declared per window, and the mean job duration it follows (seconds).
        self._window = 1
        self._mean: float | None = None
        #: The tasks this runner has loaded, by path; and as enqueued (``_task``).
        self._loaded: dict[str, Any] = {}
        self._enqueued: dict[tuple[Any, ...], Any] = {}
        #: Per queue, the metric counting the jobs started (``metrics.counter``).
        self._started_counters: dict[str, Any] = {}

    def due(self) -> models.QuerySet[Any]:
        due = super().due()
        if self.queues is not None:
            due = due.filter(queue_name__in=self.queues)
        return due.order_by("-priority", "available_at", "pk")

    scope_fields = ("queue_name",)

    def takes(self, row: Any) -> bool:
        return self.queues is None or row.queue_name in self.queues

    def claim_variant(self) -> Any:
        return tuple(sorted(self.queues)) if self.queues is not None else None

    def worker_role(self) -> str:
        # "jobs default,emails": the queues a worker takes, for the health page.
        return f"{self.name} {','.join(self.queues)}" if self.queues else self.name

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

    def process(self, rows: Sequence[Any], attempt: Attempt) -> Iterator[Outcomes]:
        """Run *rows* in priority order; yield outcomes in groups (recorded at once).

        Stops starting jobs after ``BATCH_SECONDS`` (or at the lease deadline): the
        jobs not started go back, unattempted, for any worker to take.
        """
        waiting = deque(in_running_order(rows))
        self.worker = str(heartbeat.current_worker_id() or _process_name())
        started = time.monotonic()
        stop_at = min(attempt.deadline, started + BATCH_SECONDS)
        group: Outcomes = {}
        group_started = started
        failed_keys: set[str] = set()
        window: deque[Job] = deque()
        declared: list[Job] = []
        ran = 0
        # Spans: decided once a batch (asking OpenTelemetry per job cost more than the
        # no-op job); a job with a parent context of its own always has its span.
        traced = tracing.enabled()
        spans_recorded = traced and tracing.recording()
        monotonic = time.monotonic
        stopping = self.stopping
        now = started
        while waiting or window:
            if stopping.is_set() or (ran and now >= stop_at):
                break  # the rest goes back, unattempted
            if group and (now - group_started >= GROUP_SECONDS or len(group) >= GROUP_SIZE):
                yield group
                group = {}
                now = monotonic()
            if not window:
                try:
                    declared = self._declare_window(waiting, failed_keys, attempt)
                    window = deque(declared)
                except DatabaseError:
                    if group:
                        yield group  # what ran is recorded before the error goes up
                    raise
                now = monotonic()
                continue
            row = window.popleft()
            if row.serial_key is not None and row.serial_key in failed_keys:
                continue  # declared, not run: given back uncounted
            if len(declared) > 1 and not attempt.begin(row):
                continue  # handed back to another worker meanwhile
            began = monotonic()
            if not group:
                group_started = began
            if traced and (spans_recorded or row.traceparent):
                with tracing.running(row):  # the job's span, current while it runs
                    group[row.pk] = outcome = self.run_one(row)
            else:
                group[row.pk] = outcome = self.run_one(row)
            now = monotonic()
            self._pace(now - began)
            attempt.idle()
            ran += 1
            if not isinstance(outcome, Done) and row.serial_key is not None:
                failed_keys.add(row.serial_key)
        if group:
            yield group

    def _declare_window(
        self, waiting: deque[Job], failed_keys: set[str], attempt: Attempt
    ) -> list[Job]:
        """Declare the starts of the next *waiting* jobs: a window of them, begun one by
        one; a job on its last attempt, or whose worker died during its last attempt,
        forms a window of its own (begun as it is declared)."""
        chosen: list[Job] = []
        limit = self._window
        while waiting and len(chosen) < limit:
            row = waiting[0]
            if row.serial_key is not None and row.serial_key in failed_keys:
                waiting.popleft()  # behind a failed job of its key: goes back, unattempted
                continue
            # Alone in its window: a job whose worker died during its last attempt, and a
            # job on its last attempt (if its worker dies, no job is charged an attempt it
            # did not run, and none can end FAILED without its last attempt having run).
            alone = row.unclean_end or row.attempts + 1 >= int(row.max_attempts)
            if alone and chosen:
                break
            chosen.append(waiting.popleft())
            if alone:
                break
        if not chosen:
            return []
        # A window of one is begun as it is declared; a larger one job by job.
        return attempt.start(chosen, begin=len(chosen) == 1)

    def _pace(self, seconds: float) -> None:
        """Adapt the window to this worker's recent job durations."""
        self._mean = seconds if self._mean is None else 0.8 * self._mean + 0.2 * seconds
        fits = int(START_WINDOW_SECONDS / max(self._mean, 1e-6))
        self._window = max(1, min(self._window * 2, fits, MAX_WINDOW))

    def run_one(self, row: Job) -> Outcome:
        """Run one job; its outcome (``Done`` with the return value, or the failure)."""
        api = _api()
        try:
            task = self._task(row)
        except Exception as exc:
            return self._failed(row, exc, retry=False)
        # What the job sees: RUNNING, this attempt counted (TaskContext.attempt).
        workers = self._worker_ids(row)
        row.__dict__[ATTEMPT_WORKERS] = workers  # recorded with the outcome (a copy)
        result = api.started_result(row, task, api.RUNNING, list(workers))
        # Kept: task_finished sends it again, brought up to what was recorded.
        row.task_result = result  # type: ignore[attr-defined]
        _send_task_signal(api.started, result)
        args = list(row.args)
        if task.takes_context:
            args.insert(0, api.compat.TaskContext(task_result=result))
        timed = metrics.enabled()
        if timed:
            started = self._started_counters.get(row.queue_name)
            if started is None:
                started = self._started_counters[row.queue_name] = metrics.counter(
                    "jobs", "started", row.queue_name
                )
            started.inc()
            began = time.perf_counter()
        faults.point("jobs.in_job")
        timeout = getattr(task, "timeout", None)
        try:
            if timeout:
                what = f"job {row.result_id} ({row.task_path})"
                value = call_limited(task, args, row.kwargs, timeout, what)
            else:
                value = task.call(*args, **row.kwargs)
        except KeyboardInterrupt:
            # The worker is being stopped: the job goes back at once, uncounted.
            raise
        except BaseException as exc:
            # SystemExit too: a job that exits has failed, the worker goes on (retried
            # only if its retry_on names it: the default, Exception, does not).
            _close_if_unusable(self.using)
            retry = task.retries(exc) if hasattr(task, "retries") else isinstance(exc, Exception)
            if timed:
                setattr(row, metrics.STEP_SECONDS, time.perf_counter() - began)
            return self._failed(row, exc, retry=retry)
        if timed:
            setattr(row, metrics.STEP_SECONDS, time.perf_counter() - began)
        if value is not None:
            try:
                api.check_return_value(value, row.task_path)
            except TypeError as exc:
                # The job ran and its effects happened: running it again would repeat them.
                return self._failed(row, exc, retry=False)
        return Done(value)

    def _task(self, row: Job) -> Any:
        """The task of *row* as it was enqueued (``backend.as_enqueued``); loaded once per
        path, and made once per path, priority, queue and backend (a job due at a time
        of its own is made each time: its ``run_after`` is its own)."""
        api = _api()
        if row.run_after is not None:
            return api.as_enqueued(self._loaded_task(row.task_path), row, row.backend)
        key = (row.task_path, row.priority, row.queue_name, row.backend)
        task = self._enqueued.get(key)
        if task is None:
            task = api.as_enqueued(self._loaded_task(row.task_path), row, row.backend)
            if len(self._enqueued) < MAX_TASKS:
                self._enqueued[key] = task
        return task

    def _loaded_task(self, path: str) -> Any:
        task = self._loaded.get(path)
        if task is None:
            # Once per path and runner: an import per job cost more than the job.
            task = self._loaded[path] = _api().load_task(path)
        return task

    def _failed(self, row: Job, exc: BaseException, *, retry: bool) -> Retry | Fail:
        tracing.record_failure(exc)
        kind = type(exc)
        entry = {
            "exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
            # Stored as JSON: PostgreSQL refuses a NUL (\u0000) there too.
            "traceback": storable("".join(traceback.format_exception(exc))),
            "attempt": row.attempts,
            "worker_id": self.worker,
        }
        text = f"{kind.__name__}: {exc}" if str(exc) else kind.__name__
        return Retry(text, entry) if retry else Fail(text, entry)

    # -- what is recorded ----------------------------------------------------------

    def _worker_ids(self, row: Job, worker: str | None = None) -> list[str]:
        """One entry per attempt, this one included (by *worker*, default this one)."""
        if worker is None:
            made = row.__dict__.get(ATTEMPT_WORKERS)
            if made is not None:  # made as the attempt started (``run_one``)
                return list(made)
        return [str(w) for w in row.worker_ids or []] + [worker or self.worker]

    def _attempt_values(
        self, row: Job, entry: Mapping[str, Any] | None, worker: str | None = None
    ) -> dict[str, Any]:
        values: dict[str, Any] = {"worker_ids": self._worker_ids(row, worker)}
        if row.started_at is not None:
            values["started_at"] = row.started_at  # the first attempt's start, kept
        if entry is not None:
            values["errors"] = [*(row.errors or []), dict(entry)]
        return values

    def record_time(self, started: datetime | None = None) -> clock.Instant:
        # The database's time read once per group and written as a value, so that the
        # rows in hand say exactly what was stored (task_finished sends them as they are).
        # A start was taken by the worker's clock: a finish is never recorded before it
        # (SQLite's clock counts milliseconds; another host's may run behind).
        if self.clock is not None:
            return self.now()
        moment = clock.read_now(self.using)
        if started is not None and started > moment:
            moment = started
        return clock.now(moment)

    def done_values(self, now: clock.Instant | None) -> Mapping[str, Any]:
        return {"finished_at": now, "last_error": ""}

    def done_row_values(self, row: Any, outcome: Done) -> Mapping[str, Any]:
        return {"return_value": outcome.value, **self._attempt_values(row, None)}

    def failed_values(self, row: Any, outcome: Retry | Fail | Uncertain) -> Mapping[str, Any]:
        details = outcome.details or {}
        if details.get("worker_lost"):
            # The rescue of an attempt whose worker died: that worker ran it.
            worker = str(details.get("worker") or "(lost)")
            entry = {
                "exception_class_path": WORKER_LOST,
                "traceback": f"attempt {row.attempts}: {outcome.error}",
                "attempt": row.attempts,
                "worker_id": worker,
            }
            return self._attempt_values(row, entry, worker)
        return self._attempt_values(row, details or None)

    def dead_values(self, row: Any, now: clock.Instant) -> Mapping[str, Any]:
        return {"finished_at": now}

    def held_values(self, row: Any, now: clock.Instant) -> Mapping[str, Any]:
        return {"finished_at": now}

    def requeue_values(self) -> Mapping[str, Any]:
        from django_outbox.jobs.models import Resolution

        return {"finished_at": None, "resolution": Resolution.NONE, "cancel_requested": False}

    # -- hooks ---------------------------------------------------------------------

    def maintain(self) -> None:
        from django_outbox.jobs import batches

        batches.sweep(self.using)

    def wake(self) -> None:
        """Wake the workers of each queue that has due jobs."""
        queues = self.queues
        if queues is None:
            queues = sorted(
                Job.objects.using(self.using)
                .filter(state=JobState.READY, blocked=False, available_at__lte=self.now())
                .order_by()
                .values_list("queue_name", flat=True)
                .distinct()
            )
        for queue in queues:
            triggers.dispatch(f"jobs:{queue}", self.using, [])

    def on_done(self, rows: Sequence[Any]) -> None:
        self.logger.info("ran %d job(s)", len(rows))
        signals.emit(signals.jobs_finished, sender=Running, jobs=list(rows))
        _send_finished(self.using, rows)
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

    def log_fields(self, row: Any) -> dict[str, Any]:
        fields = super().log_fields(row)
        fields.update(
            id=str(row.result_id), task=row.task_path, queue=row.queue_name, key=row.serial_key
        )
        return fields

    def on_failed(self, row: Any, error: str, will_retry: bool) -> None:
        if will_retry:
            text = "job %s (%s) attempt %d failed, will retry: %s"
        else:
            text = "job %s (%s) FAILED after attempt %d: %s"
        self.log_failure(row, text, will_retry, row.result_id, row.task_path, row.attempts, error)
        signals.emit(
            signals.job_failed, sender=Running, job=row, error=error, will_retry=will_retry
        )
        if not will_retry:
            _send_finished(self.using, [row])
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


class _TasksApi:
    """Django's Tasks API and our backend's helpers, imported once, on first use: this
    module is imported wherever the engine's parts are, and the Tasks API is there only
    when jobs are used (an import in a function is paid on every call)."""

    def __init__(self) -> None:
        from django_outbox.jobs import backend, compat

        self.compat = compat
        self.backend_class = backend.JobsBackend
        self.to_result = backend.to_result
        self.started_result = backend.started_result
        self.task_errors = backend.task_errors
        self.as_enqueued = backend.as_enqueued
        self.load_task = backend.load_task
        self.check_return_value = backend.check_return_value
        self.started = compat.signals.task_started
        self.finished = compat.signals.task_finished
        self.RUNNING = compat.TaskResultStatus.RUNNING
        self.statuses = {status.value: status for status in compat.TaskResultStatus}


_API: _TasksApi | None = None


def _api() -> _TasksApi:
    global _API
    if _API is None:
        _API = _TasksApi()
    return _API


def _send_task_signal(signal: Any, result: Any) -> None:
    """Django's ``task_started`` / ``task_finished``, sent as Django's docs say: by the
    backend class (``sender=JobsBackend``)."""
    try:
        signal.send(sender=_api().backend_class, task_result=result)
    except Exception:
        name = "task_started" if signal is _api().started else "task_finished"
        logger.exception("a %s receiver raised", name)


def _send_finished(using: str, rows: Sequence[Any]) -> None:
    """``task_finished`` for jobs whose outcome is final and stored (SUCCESSFUL, or FAILED
    for good), with their results as stored: *rows* carry what was recorded (the runner
    brings them up to date). A failed attempt that will be retried has not finished: it
    sends ``job_failed``."""
    api = _api()
    if not api.finished.has_listeners(api.backend_class):
        return
    for job in rows:
        if job.state not in (JobState.SUCCESSFUL, JobState.FAILED):
            continue
        try:
            result = _as_recorded(job) if hasattr(job, "task_result") else api.to_result(job)
        except Exception:
            logger.exception("could not build the result of job %s", job.result_id)
            continue
        _send_task_signal(api.finished, result)


def _as_recorded(job: Any) -> Any:
    """The result the job saw while it ran (its task, its arguments), as recorded now (a
    copy: the one sent with task_started stays as its receivers saw it)."""
    api = _api()
    started = job.task_result
    result = _copy_result(started)
    set_attribute = object.__setattr__  # a frozen dataclass: as Django's backends do
    # The runner brought the row up to date: its times are values (``_value`` for any
    # left as expressions).
    moments = job.started_at, job.finished_at, job.last_attempted_at
    if any(moment is not None and type(moment) is not datetime for moment in moments):
        moments = tuple(_value(moment) for moment in moments)
    set_attribute(result, "status", api.statuses[job.state])
    set_attribute(result, "started_at", moments[0])
    set_attribute(result, "finished_at", moments[1])
    set_attribute(result, "last_attempted_at", moments[2])
    if job.state == JobState.SUCCESSFUL:
        # A success adds no error, and its workers are those the start was sent with.
        set_attribute(result, "_return_value", job.return_value)
        return result
    set_attribute(result, "worker_ids", [str(w) for w in job.worker_ids or []])
    set_attribute(result, "errors", api.task_errors(job.errors))
    return result


#: Per result class, the slots a copy carries over, and a getter of them all.
_SLOTS: dict[type, tuple[tuple[str, ...], Any]] = {}


def _copy_result(result: Any) -> Any:
    """A shallow copy of a ``TaskResult`` (a frozen dataclass, with slots in the
    backport): ``copy.copy`` goes through pickling's protocol, several times slower."""
    cls = type(result)
    if hasattr(result, "__dict__"):
        copied = object.__new__(cls)
        copied.__dict__.update(result.__dict__)
        return copied
    known = _SLOTS.get(cls)
    if known is None:
        names = tuple(
            name
            for klass in cls.__mro__
            for name in getattr(klass, "__slots__", ())
            if name not in ("__dict__", "__weakref__")
        )
        known = _SLOTS[cls] = (names, operator.attrgetter(*names) if len(names) > 1 else None)
    names, getter = known
    if getter is None:
        return copy.copy(result)
    try:
        values = getter(result)
    except AttributeError:  # a slot never set: copied one by one
        return _copy_slots(result, names)
    copied = object.__new__(cls)
    set_attribute = object.__setattr__
    for name, value in zip(names, values, strict=True):
        set_attribute(copied, name, value)
    return copied


def _copy_slots(result: Any, names: tuple[str, ...]) -> Any:
    copied = object.__new__(type(result))
    for name in names:
        try:
            object.__setattr__(copied, name, getattr(result, name))
        except AttributeError:
            continue
    return copied


def _value(moment: Any) -> Any:
    return getattr(moment, "value", moment)


def _close_if_unusable(using: str) -> None:
    """After a job failed: close the database connection only if the failure broke it
    (a query interrupted by a timeout, a lost server), not for every failing job."""
    connection = connections[using]
    if connection.connection is None or not connection.errors_occurred:
        return
    if connection.in_atomic_block or not connection.is_usable():
        connection.close()
    else:
        connection.errors_occurred = False


__all__ = ["Jobs", "Running"]
