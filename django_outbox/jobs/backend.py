"""The ``django.tasks`` backend: ``enqueue`` is an INSERT in the caller's transaction.

Configure it in ``TASKS``::

    TASKS = {"default": {"BACKEND": "django_outbox.jobs.JobsBackend",
                         "QUEUES": ["default", "emails"]}}

and write tasks with Django's own decorator; our options ride on its
keyword arguments (Django passes them to the backend's ``task_class``)::

    @task(max_attempts=5, dont_retry=(ValueError,), unique_key="sync-{customer_id}")
    def sync_customer(customer_id): ...
"""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, router, transaction
from django.utils.module_loading import import_string

from django_outbox import metrics, tracing
from django_outbox.conf import get_settings
from django_outbox.engine import clock, partitions, triggers
from django_outbox.engine.ids import uuid7
from django_outbox.engine.insert import fast_insert
from django_outbox.exceptions import OutboxError
from django_outbox.jobs import compat

if TYPE_CHECKING:
    from django_outbox.jobs.models import Job

#: Longest unique key (the column's size).
MAX_UNIQUE_KEY_LENGTH = 255
#: Tasks a backend remembers as validated (the set is emptied when full).
MAX_VALIDATED = 1024

UniqueKey = str | Callable[..., str] | None


class JobArgumentsError(OutboxError, TypeError):
    """A job's arguments cannot be stored as JSON and read back unchanged (Django's Tasks
    API raises a ``TypeError`` too, "Unsupported type"); nothing was stored."""


class JobReturnValueError(OutboxError, TypeError):
    """Recorded (as the attempt's error) for a job whose return value cannot be stored
    as JSON: the job ended FAILED without a retry, since its work was done."""


class WorkerLost(OutboxError):
    """Recorded, never raised: the attempt's worker died before it could record how the
    attempt ended (killed, out of memory, its machine gone)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobTask(compat.Task):  # type: ignore[misc,valid-type,unused-ignore]
    """Django's ``Task`` with the options of our backend (all optional).

    - ``max_attempts``: runs before a failing job ends FAILED (default: the
      ``JOBS`` section's ``MAX_ATTEMPTS``, 3 unless set).
    - ``retry_on`` / ``dont_retry``: which exceptions are retried (default:
      every ``Exception``; ``dont_retry`` wins).
    - ``retry_base_seconds`` / ``retry_max_seconds``: the exponential backoff
      between attempts, with equal jitter (between half and all of
      ``base * 2**(attempt-1)``, capped at the maximum; default: the section's
      settings).
    - ``timeout``: seconds an attempt may run before ``JobTimeout`` (a
      ``TimeoutError``) is raised in it (see ``django_outbox.jobs.timeouts``).
    - ``unique_key``: while a job with this key is READY or RUNNING, enqueuing
      returns that job's result instead of a new job. A string (formatted with
      the call's keyword arguments, ``"sync-{customer_id}"``) or a callable
      taking the call's arguments.
    - ``serial_key``: jobs with the same serial key run one at a time, in
      enqueue (commit) order; a failed one holds back only its own key until
      it is retried, skipped or cancelled. Same forms as ``unique_key``.
    """

    max_attempts: int | None = None
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    dont_retry: tuple[type[BaseException], ...] = ()
    retry_base_seconds: float | None = None
    retry_max_seconds: float | None = None
    timeout: float | None = None
    unique_key: UniqueKey = None
    serial_key: UniqueKey = None

    def using(
        self, *, unique_key: UniqueKey = None, serial_key: UniqueKey = None, **changes: Any
    ) -> JobTask:
        """Django's ``using()`` (priority, queue_name, run_after, backend), plus a
        ``unique_key`` and a ``serial_key`` for this call."""
        task: JobTask = compat.Task.using(self, **changes)
        if unique_key is not None:
            task = dataclasses.replace(task, unique_key=unique_key)
        if serial_key is not None:
            task = dataclasses.replace(task, serial_key=serial_key)
        return task

    def retries(self, exc: BaseException) -> bool:
        """Whether *exc* raised by this task is retried (while attempts are left)."""
        return isinstance(exc, self.retry_on) and not isinstance(exc, self.dont_retry)


class JobsBackend(compat.BaseTaskBackend):  # type: ignore[misc,valid-type,unused-ignore]
    """Durable jobs in the database, run by Celery workers or ``manage.py jobs_worker``.

    ``OPTIONS``: ``DATABASE`` (alias of the database that holds the jobs;
    default: the router's choice for the job model).
    """

    task_class = JobTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        super().__init__(alias, params)
        self.database: str | None = self.options.get("DATABASE")
        self._validated: set[Any] = set()

    # -- validation --------------------------------------------------------------

    def validate_task(self, task: Any) -> None:
        super().validate_task(task)
        if not isinstance(task, JobTask):
            return  # a plain Task (another backend's task_class): Django's checks only
        if task.max_attempts is not None and (
            isinstance(task.max_attempts, bool)
            or not isinstance(task.max_attempts, int)
            or task.max_attempts < 1
        ):
            raise compat.InvalidTask(
                f"max_attempts must be a positive integer, got {task.max_attempts!r}"
            )
        for name in ("retry_on", "dont_retry"):
            value = getattr(task, name)
            if not isinstance(value, tuple) or not all(
                isinstance(c, type) and issubclass(c, BaseException) for c in value
            ):
                raise compat.InvalidTask(f"{name} must be a tuple of exception classes")
        for name in ("retry_base_seconds", "retry_max_seconds", "timeout"):
            value = getattr(task, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise compat.InvalidTask(f"{name} must be a non-negative number of seconds")
        for name in ("unique_key", "serial_key"):
            key = getattr(task, name)
            if key is not None and not (isinstance(key, str) and key) and not callable(key):
                raise compat.InvalidTask(f"{name} must be a non-empty string or a callable")

    # -- enqueue -----------------------------------------------------------------

    def enqueue(self, task: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """Store the job in the current transaction (or its own); it runs after the
        commit. Raises ``JobArgumentsError`` for arguments that are not plain JSON."""
        if task not in self._validated:
            # Tasks are immutable: one validation each (it inspects the signature). A
            # variant per call (its own run_after or key) would grow the set for ever.
            self.validate_task(task)
            if len(self._validated) >= MAX_VALIDATED:
                self._validated.clear()
            self._validated.add(task)
        args = list(args)
        kwargs = dict(kwargs)
        task_path = task.module_path  # a property that formats the path on each read
        problem = json_problem(args, "args") or json_problem(kwargs, "kwargs")
        if problem is not None:
            raise JobArgumentsError(f"arguments of {task_path}: {problem}")
        settings = get_settings()
        options = task if isinstance(task, JobTask) else None
        row: dict[str, Any] = {
            "result_id": uuid7(),
            "task_path": task_path,
            "backend": self.alias,
            "queue_name": task.queue_name,
            "priority": task.priority,
            "args": args,
            "kwargs": kwargs,
            "max_attempts": (options.max_attempts if options else None)
            or settings.jobs.engine.max_attempts,
            "unique_key": key_of(options, "unique_key", args, kwargs) if options else None,
            "serial_key": key_of(options, "serial_key", args, kwargs) if options else None,
        }
        if tracing.enabled():
            traceparent = tracing.current_traceparent()
            if traceparent:  # the job's run span is a child of it
                row["traceparent"] = traceparent
        from django_outbox.jobs.models import Job

        db = self.database or router.db_for_write(Job)
        if task.run_after is not None:
            row["available_at"] = row["run_after"] = task.run_after
        from django_outbox.jobs import batches

        opened = batches.current()
        if opened is not None:
            if opened.using != db:
                raise JobArgumentsError(
                    f"the open batch is on database {opened.using!r}, this job on {db!r}"
                )
            row["batch_id"] = opened.row.pk
        if row["serial_key"] is not None and not connections[db].in_atomic_block:
            # The key counter's row lock must last until the job row commits.
            with transaction.atomic(using=db):
                return self._store(task, row, db)
        return self._store(task, row, db)

    def _store(self, task: Any, row: dict[str, Any], db: str) -> Any:
        if row["serial_key"] is not None:
            # Commit order within the key: the counter row stays locked until then.
            from django_outbox.engine import ordering
            from django_outbox.jobs.models import JobKey

            row["sequence"], row["blocked"] = ordering.next_sequence(
                db, JobKey, {"serial_key": row["serial_key"]}
            )
        if row["unique_key"] is None:
            pk, enqueued_at = _insert(db, row)
        else:
            existing, (pk, enqueued_at) = _insert_unique(db, row)
            if existing is not None:
                # That job's result: its priority, queue and run_after, not this call's.
                return to_result(
                    existing, task=as_enqueued(task, existing, self.alias), backend=self.alias
                )
        if "batch_id" in row:
            from django_outbox.jobs import batches

            opened = batches.current()
            assert opened is not None
            opened.count += 1
        triggers.schedule(f"jobs:{row['queue_name']}", db, pk)
        if metrics.enabled():
            metrics.counted_on_commit("jobs", "enqueued", row["queue_name"], db)
        # What to_result() would make of the new row, without building the row.
        result = compat.TaskResult(
            task=task,
            id=str(row["result_id"]),
            status=compat.TaskResultStatus.READY,
            enqueued_at=enqueued_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=row["args"],
            kwargs=row["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        _signal("task_enqueued", result)
        return result

    # -- results -----------------------------------------------------------------

    def get_result(self, result_id: str) -> Any:
        """The job's current result; ``TaskResultDoesNotExist`` if unknown (or purged)."""
        try:
            key = uuid.UUID(str(result_id))
        except ValueError:
            raise compat.TaskResultDoesNotExist(result_id) from None
        from django_outbox.jobs.models import Job

        db = self.database or router.db_for_read(Job)
        job = Job.objects.using(db).filter(result_id=key).first()
        if job is None:
            raise compat.TaskResultDoesNotExist(result_id)
        return to_result(job, backend=self.alias)


def _insert(db: str, row: dict[str, Any]) -> tuple[Any, datetime]:
    """Store *row*; return the new job's primary key and enqueue time."""
    from django_outbox.jobs.models import Job

    connection = connections[db]
    if not connection.features.can_return_columns_from_insert:
        job = Job(**row, created_at=clock.now())
        if "available_at" not in row:
            job.available_at = clock.now()
        job.save(force_insert=True, using=db)
        # The stamp is the database's (an expression until read back): one more query,
        # on the databases that cannot return it from the INSERT (MySQL).
        stamp = Job.objects.using(db).filter(pk=job.pk).values_list("created_at", flat=True)
        return job.pk, stamp.get()
    varying = _VARYING + tuple(name for name in _OPTIONAL if row.get(name) is not None)
    clock_fields = ("created_at",) if "available_at" in row else ("created_at", "available_at")
    statement = fast_insert(connection, Job, varying=varying, clock_fields=clock_fields)
    # Checked plain JSON: passed as text, not adapted again.
    raw = {"args": json.dumps(row["args"]), "kwargs": json.dumps(row["kwargs"])}
    inserted = statement.run_bare(connection, row, raw=raw)
    assert inserted is not None  # no conflict target: a row or an error
    return inserted


def _insert_unique(db: str, row: dict[str, Any]) -> tuple[Job | None, tuple[Any, Any]]:
    """Insert unless a READY or RUNNING job has the same unique key: ``(None, (pk,
    enqueued_at))`` for the new job, or ``(existing job, (None, None))``."""
    from django_outbox.jobs.models import ACTIVE_STATES, Job

    active = Job.objects.using(db).filter(unique_key=row["unique_key"], state__in=ACTIVE_STATES)
    if partitions.is_partitioned(Job, db):
        # No unique index of active keys on a partitioned table: a lock on the key,
        # held to the end of the caller's transaction, then a read and the insert.
        with transaction.atomic(using=db):
            partitions.lock_unique_key(db, row["unique_key"])
            existing = active.first()
            if existing is not None:
                return existing, (None, None)
            return None, _insert(db, row)
    if connections[db].vendor == "mysql":
        # No partial unique index there: a locking read of the key, then the insert.
        # Concurrent first enqueues of one key may both insert (documented).
        with transaction.atomic(using=db):
            existing = active.select_for_update().first()
            if existing is not None:
                return existing, (None, None)
            return None, _insert(db, row)
    for _ in range(3):
        try:
            with transaction.atomic(using=db):  # a savepoint: the caller's transaction survives
                return None, _insert(db, row)
        except IntegrityError:
            existing = active.first()
            if existing is not None:
                return existing, (None, None)
            # It finished between our insert and our read: try again.
    raise IntegrityError(f"could not enqueue the job with unique key {row['unique_key']!r}")


#: The fields an enqueue sets; every other column is written with its default.
_VARYING = (
    "result_id",
    "task_path",
    "backend",
    "queue_name",
    "priority",
    "args",
    "kwargs",
    "max_attempts",
)
#: Fields an enqueue sets only sometimes (``run_after`` and the due time it sets, keys,
#: a serial key's place, a batch, the trace context); left out of the statement (their
#: column's default: NULL, or "" for the trace context) when not set.
_OPTIONAL = (
    "available_at",
    "run_after",
    "unique_key",
    "serial_key",
    "sequence",
    "blocked",
    "batch_id",
    "traceparent",
)


def key_of(task: JobTask, name: str, args: list[Any], kwargs: dict[str, Any]) -> str | None:
    """The *name* key (``unique_key``, ``serial_key``) of this call, or ``None``."""
    spec = getattr(task, name)
    if spec is None:
        return None
    try:
        key = spec(*args, **kwargs) if callable(spec) else spec.format(*args, **kwargs)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise JobArgumentsError(
            f"{name} of {task.module_path} could not be made from the arguments: {exc!r}"
        ) from exc
    if not isinstance(key, str) or not key or len(key) > MAX_UNIQUE_KEY_LENGTH:
        raise JobArgumentsError(
            f"{name} of {task.module_path} must give a non-empty string of at most "
            f"{MAX_UNIQUE_KEY_LENGTH} characters, got {key!r}"
        )
    return key


def check_json(
    value: Any, what: str, path: str, *, error: type[Exception] = JobArgumentsError
) -> None:
    """Raise *error* (default ``JobArgumentsError``) naming the first part of *value* that
    would not come back from JSON as it went in (a datetime, a Decimal, a set, bytes, a
    non-string key…), why, and what to pass instead."""
    problem = json_problem(value, path)
    if problem is not None:
        raise error(f"{what}: {problem}")


def check_return_value(value: Any, task_path: str) -> None:
    """Raise ``JobReturnValueError`` if the return value of the job of *task_path* cannot
    be stored as JSON (the job's error then says why, and that it is not retried)."""
    problem = json_problem(value, "value", hint=False)
    if problem is not None:
        raise JobReturnValueError(
            f"the return value of {task_path}: {problem}. The job is FAILED and not "
            "retried: it ran, and running it again would repeat what it did. Return plain "
            "JSON (str, int, float, bool, None, lists, dicts with string keys)"
        )


#: What to pass instead of common values that are not JSON.
_HINTS: dict[type, str] = {
    datetime: "pass .isoformat() and parse it in the task",
    date: "pass .isoformat() and parse it in the task",
    Decimal: "pass str(value) and make a Decimal of it in the task",
    uuid.UUID: "pass str(value)",
    set: "pass a sorted list",
    frozenset: "pass a sorted list",
}


def json_problem(value: Any, path: str, *, hint: bool = True) -> str | None:
    """Why *value* would not come back from JSON as it went in, naming the part of it at
    *path* that would not, and (with *hint*) what to pass instead; ``None`` if it would
    (tuples come back as lists, as Django's Tasks API normalises them)."""
    if isinstance(value, str):
        if "\x00" in value:
            return (
                f"{path} contains a NUL character (\\u0000), which PostgreSQL cannot store "
                "(refused on every database, so that a job behaves alike on each)"
                + ("; remove it, or pass the text base64-encoded" if hint else "")
            )
        return None
    if value is None or isinstance(value, bool | int):
        return None
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return (
            f"{path} is {value!r}, which JSON cannot hold (it has no NaN or infinity, "
            "and the database would refuse it)" + ("; pass None or a string" if hint else "")
        )
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            problem = json_problem(item, f"{path}[{index}]", hint=hint)
            if problem is not None:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return _key_problem(key, path)
            if "\x00" in key:
                return f"{path} has the key {key!r}, with a NUL character PostgreSQL cannot store"
            problem = json_problem(item, f"{path}[{key!r}]", hint=hint)
            if problem is not None:
                return problem
        return None
    kind = type(value)
    if isinstance(value, bytes | bytearray):
        return (
            f"{path} is bytes, refused here (Unsupported type: {kind!r}): Django's Tasks "
            "API would decode UTF-8 bytes to str, so a str would come back instead, and "
            "bytes that are not UTF-8 would fail only on the day they occur"
            + ("; pass value.decode() for text, or base64 for binary data" if hint else "")
        )
    advice = next(
        (advice for base, advice in _HINTS.items() if isinstance(value, base)),
        "pass plain JSON values (str, int, float, bool, None, list, dict with str keys)",
    )
    return (
        f"{path} is a {kind.__module__}.{kind.__qualname__}, which is not JSON "
        f"(Unsupported type: {kind!r}): jobs are stored as JSON" + (f"; {advice}" if hint else "")
    )


def _key_problem(key: Any, path: str) -> str:
    try:
        stored = next(iter(json.loads(json.dumps({key: None}))))
    except TypeError:
        return f"{path} has the key {key!r}, which JSON cannot hold; use string keys"
    return (
        f"{path} has the key {key!r}, which would come back from JSON as {stored!r}: it "
        "would not be found under the key it was given (Django's Tasks API keeps it as "
        f"it is, and only a stored job would see {stored!r}); use string keys"
    )


def to_result(
    job: Job,
    *,
    task: Any = None,
    backend: str | None = None,
    status: Any = None,
    worker_ids: list[str] | None = None,
) -> Any:
    """The ``TaskResult`` that *job* is (Django's class; our row behind it), read through
    the backend alias *backend* (default: the job's own). Its task is *task* if given,
    otherwise the job's task as it was enqueued (``as_enqueued``); its *status* and
    *worker_ids* are the job's unless given (a worker gives those of the attempt it
    starts)."""
    alias = backend or job.backend
    if task is None:
        task = as_enqueued(load_task(job.task_path), job, alias)
    errors = task_errors(job.errors)
    result = compat.TaskResult(
        task=task,
        id=str(job.result_id),
        status=_STATUSES[job.state] if status is None else status,
        enqueued_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        last_attempted_at=job.last_attempted_at,
        args=list(job.args or []),
        kwargs=dict(job.kwargs or {}),
        backend=alias,
        errors=errors,
        worker_ids=[str(w) for w in job.worker_ids or []] if worker_ids is None else worker_ids,
    )
    if job.state == "SUCCESSFUL":
        compat.set_attribute(result, "_return_value", job.return_value)
    return result


def task_errors(stored: list[dict[str, Any]] | None) -> list[Any]:
    """Django's ``TaskError`` for each error a job row stores."""
    if not stored:
        return []
    return [
        compat.TaskError(
            exception_class_path=str(e.get("exception_class_path", "")),
            traceback=str(e.get("traceback", "")),
        )
        for e in stored
    ]


#: Django's status for each state a job row stores (they share their names).
_STATUSES = {status.value: status for status in compat.TaskResultStatus}


def started_result(job: Job, task: Any, status: Any, worker_ids: list[str]) -> Any:
    """``to_result(job, task=task, status=status, worker_ids=worker_ids)`` for a job a
    worker starts, its row read from the database.

    Its arguments came back from JSON, so they are already what ``TaskResult``'s
    ``__post_init__`` makes of them (``normalize_json``: JSON's types, new lists and
    dicts); the result is then filled in directly, its arguments copied as that
    normalization copies them, which costs a no-op job a fifth of its run. Done so only
    while Django's ``TaskResult`` has the fields this knows (Django 6.1, the 0.x
    backport); otherwise, and for anything but JSON's types, through the constructor.
    ``tests/conformance/test_results_built.py`` holds the two ways equal."""
    if not _DIRECT_RESULTS:
        return to_result(job, task=task, status=status, worker_ids=worker_ids)
    try:
        args = _json_copy(job.args or [])
        kwargs = _json_copy(job.kwargs or {})
    except TypeError:
        return to_result(job, task=task, status=status, worker_ids=worker_ids)
    result = object.__new__(compat.TaskResult)
    fill = object.__setattr__
    fill(result, "task", task)
    fill(result, "id", str(job.result_id))
    fill(result, "status", status)
    fill(result, "enqueued_at", job.created_at)
    fill(result, "started_at", job.started_at)
    fill(result, "finished_at", job.finished_at)
    fill(result, "last_attempted_at", job.last_attempted_at)
    fill(result, "args", args)
    fill(result, "kwargs", kwargs)
    fill(result, "backend", job.backend)
    fill(result, "errors", task_errors(job.errors))
    fill(result, "worker_ids", worker_ids)
    fill(result, "_return_value", None)
    return result


#: The fields of Django's ``TaskResult`` that ``started_result`` fills in.
_RESULT_FIELDS = (
    "task",
    "id",
    "status",
    "enqueued_at",
    "started_at",
    "finished_at",
    "last_attempted_at",
    "args",
    "kwargs",
    "backend",
    "errors",
    "worker_ids",
    "_return_value",
)
_DIRECT_RESULTS = tuple(f.name for f in dataclasses.fields(compat.TaskResult)) == _RESULT_FIELDS
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _json_copy(value: Any) -> Any:
    """*value* (JSON's types) with its lists and dicts copied; ``TypeError`` for any
    other type (the constructor then says what it makes of it)."""
    kind = type(value)
    if kind is list:
        return [item if type(item) in _SCALARS else _json_copy(item) for item in value]
    if kind is dict:
        copied = {}
        for key, item in value.items():
            if type(key) is not str:
                raise TypeError(f"not a JSON key: {type(key).__name__}")
            copied[key] = item if type(item) in _SCALARS else _json_copy(item)
        return copied
    if kind in _SCALARS:
        return value
    raise TypeError(f"not a JSON value: {kind.__name__}")


def as_enqueued(task: Any, job: Job, alias: str) -> Any:
    """*task* (as its module declares it) as the *job* was enqueued: with the job's
    priority, queue and ``run_after``, on the backend alias *alias* (``refresh()`` goes
    through it). Per-call keys are not restored (the job keeps the keys they gave).

    The task was validated when it was enqueued; if this process's ``TASKS`` no longer
    accepts it (a queue since removed), the result still reads back as it was."""
    changes = {
        name: value
        for name, value in (
            ("priority", job.priority),
            ("queue_name", job.queue_name),
            ("run_after", job.run_after),
            ("backend", alias),
        )
        if value is not None and getattr(task, name) != value
    }
    if not changes:
        return task
    try:
        return task.using(**changes)
    except compat.InvalidTask:
        copy = dataclasses.replace(task)  # the declared task validates as it did on import
        for name, value in changes.items():
            compat.set_attribute(copy, name, value)
        return copy


class TasksApiMismatch(OutboxError, TypeError):
    """A task module declared a task with our options (``max_attempts`` …), but the
    ``@task`` it used built Django's plain ``Task``: the backend it named is not ours in
    this process, or the module uses another Tasks API than ours."""


#: The options our task class adds to Django's ``Task``.
JOB_OPTIONS = tuple(
    f.name
    for f in dataclasses.fields(JobTask)
    if f.name not in {g.name for g in dataclasses.fields(compat.Task)}
)


def load_task(path: str) -> Any:
    """The ``Task`` object at dotted *path* (a module-level decorated function).

    Raises ``TasksApiMismatch`` when importing the module fails because ``@task``
    refused one of our options: the worker's Tasks API or ``TASKS`` is not the one the
    task was written for, which Django's ``TypeError`` does not say."""
    try:
        found = import_string(path)
    except TypeError as exc:
        option = next((name for name in JOB_OPTIONS if f"'{name}'" in str(exc)), None)
        if option is None:
            raise
        raise TasksApiMismatch(_mismatch(path, option, exc)) from exc
    if not isinstance(found, compat.Task):
        raise TypeError(f"{path} is not a task (decorate it with @task)")
    return found


def _mismatch(path: str, option: str, exc: TypeError) -> str:
    import importlib.metadata

    import django
    from django.conf import settings

    if compat.SOURCE == "django_tasks":
        api = f"django-tasks {importlib.metadata.version('django-tasks')} (the backport)"
    else:
        api = f"django.tasks of Django {django.get_version()}"
    backends = getattr(settings, "TASKS", None) or {}
    seen = ", ".join(
        f"{alias!r} → {params.get('BACKEND')}"
        for alias, params in backends.items()
        if isinstance(params, Mapping)
    )
    return (
        f"{path} cannot be loaded: {exc}. {option!r} is an option of django-outbox's jobs "
        "backend, but the @task that declared it built a plain Task. In this process "
        f"django_outbox uses {api} with TASKS {seen or 'unset (the immediate backend)'}. "
        "Check that the task's backend alias is set to 'django_outbox.jobs.JobsBackend' "
        f"in the settings this worker runs with, that its module imports task from "
        f"{compat.SOURCE} (on Django 5.2: django-tasks 0.12, the 'jobs' extra), and "
        "restart workers started before the django-tasks backport was installed."
    )


def _signal(name: str, result: Any) -> None:
    getattr(compat.signals, name).send(sender=JobsBackend, task_result=result)


__all__ = [
    "JobArgumentsError",
    "JobReturnValueError",
    "JobTask",
    "JobsBackend",
    "TasksApiMismatch",
    "WorkerLost",
    "as_enqueued",
    "check_json",
    "check_return_value",
    "to_result",
]
