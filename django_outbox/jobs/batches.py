"""Batches: jobs enqueued together, and a callback job enqueued exactly once when all of
them have finished.

::

    from django_outbox.jobs import batch

    with batch(on_finish=album_ready, album_id=album.pk) as resizing:
        for photo in album.photos.all():
            resize.enqueue(photo.pk)       # Django's own enqueue: joins the batch

    # later, once every resize is SUCCESSFUL or FAILED for good:
    # album_ready.enqueue(album_id=…, batch={"id": …, "total": n, "succeeded": s, "failed": f})

How "exactly once" holds: the batch row is created in the transaction that
enqueues its jobs. Whenever jobs of a batch finish, the process that
recorded them locks the batch row, counts the batch's finished jobs, and if
all are finished enqueues the callback and marks the batch finished, in one
transaction: the lock makes concurrent finishers take turns, the mark makes
every later check a no-op, and a crash before the commit leaves both undone
for the next check. The jobs sweep checks batches whose jobs have all
finished, in case the process that finished the last one died first.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, router, transaction
from django.db.models import Count, Exists, OuterRef, Q

from django_outbox.engine import clock, faults
from django_outbox.jobs.models import ACTIVE_STATES, Job, JobBatch, JobState
from django_outbox.validation import storable

logger = logging.getLogger("django_outbox.jobs")


@dataclass
class OpenBatch:
    """The batch being filled inside a ``batch()`` block."""

    row: JobBatch
    using: str
    #: New jobs enqueued into it so far.
    count: int = 0

    @property
    def id(self) -> str:
        return str(self.row.batch_id)


_current: contextvars.ContextVar[OpenBatch | None] = contextvars.ContextVar(
    "django_outbox_batch", default=None
)


def current() -> OpenBatch | None:
    """The batch that ``enqueue`` in this context adds its jobs to, if any."""
    return _current.get()


@contextmanager
def batch(on_finish: Any = None, *, using: str | None = None, **kwargs: Any) -> Iterator[OpenBatch]:
    """Group the jobs enqueued inside the block; when all have finished, enqueue
    *on_finish* (a task) once, with *kwargs* and ``batch={"id", "total",
    "succeeded", "failed"}``. The block is one transaction: the batch and its jobs
    commit together (an exception rolls them all back). An empty batch enqueues its
    callback at once."""
    from django_outbox.jobs import compat
    from django_outbox.jobs.backend import JobArgumentsError, check_json

    if _current.get() is not None:
        raise RuntimeError("batches do not nest: finish the open batch first")
    if on_finish is not None and not isinstance(on_finish, compat.Task):
        raise TypeError(f"on_finish must be a task (decorated with @task), got {on_finish!r}")
    if "batch" in kwargs:
        raise JobArgumentsError("the callback's 'batch' argument is the batch's summary")
    check_json(kwargs, "arguments of the batch callback", "kwargs")
    db = using or router.db_for_write(Job)
    with transaction.atomic(using=db):
        row = JobBatch.objects.using(db).create(
            callback_path=on_finish.module_path if on_finish is not None else "",
            callback_kwargs=kwargs,
        )
        opened = OpenBatch(row=row, using=db)
        token = _current.set(opened)
        try:
            yield opened
        finally:
            _current.reset(token)
        JobBatch.objects.using(db).filter(pk=row.pk).update(total=opened.count)
        row.total = opened.count
        if opened.count == 0:
            complete(db, [row.pk])


def complete(using: str, batch_pks: Iterable[int]) -> int:
    """Enqueue the callback of each batch in *batch_pks* whose jobs have all finished
    (once per batch, whoever calls); return how many callbacks were enqueued.

    Each batch is completed on its own: a callback that cannot be enqueued (its task
    was renamed, its arguments no longer fit) is logged and recorded on the batch
    (``last_error``), and the other batches go on; the sweep tries it again."""
    fired = 0
    for pk in sorted(set(batch_pks)):
        try:
            fired += _complete_one(using, pk)
        except DatabaseError:
            raise  # the database itself: the caller's outage handling says it
        except Exception as exc:
            _record_error(using, pk, exc)
    return fired


def _complete_one(using: str, pk: int) -> int:
    batches = JobBatch.objects.using(using)
    jobs = Job.objects.using(using).filter(batch_id=pk)
    # Cheap while the batch runs: one probe of the active jobs' index.
    if jobs.filter(state__in=ACTIVE_STATES).exists():
        return 0
    with transaction.atomic(using=using):
        found = batches.select_for_update().filter(pk=pk, finished_at__isnull=True).first()
        if found is None:
            return 0  # finished already (its callback was enqueued once)
        # Counted after the lock: every finisher that committed before is seen.
        counts = jobs.aggregate(
            succeeded=Count("pk", filter=Q(state=JobState.SUCCESSFUL)),
            failed=Count("pk", filter=Q(state=JobState.FAILED)),
        )
        succeeded, failed = counts["succeeded"], counts["failed"]
        if succeeded + failed < found.total:
            return 0
        summary = {
            "id": str(found.batch_id),
            "total": found.total,
            "succeeded": succeeded,
            "failed": failed,
        }
        callback_id = None
        if found.callback_path:
            callback_id = _enqueue_callback(found, summary)
        batches.filter(pk=pk).update(
            finished_at=clock.now(),
            succeeded=succeeded,
            failed=failed,
            callback_result_id=callback_id,
            last_error="",
        )
        faults.point("jobs.in_batch_finisher")  # callback enqueued, batch marked: uncommitted
    logger.info(
        "batch %s finished: %d succeeded, %d failed of %d",
        found.batch_id,
        succeeded,
        failed,
        found.total,
    )
    return 1


def _record_error(using: str, pk: int, exc: Exception) -> None:
    """Keep why a batch could not be completed on the batch (logged when it changes)."""
    text = storable(f"{type(exc).__name__}: {exc}"[:4000])
    rows = JobBatch.objects.using(using).filter(pk=pk)
    try:
        changed = rows.exclude(last_error=text).update(last_error=text)
    except DatabaseError:
        changed = 1
    if changed:
        logger.error(
            "batch %s: its callback could not be enqueued (%s); the other batches go on, and "
            "the sweep tries again (fix the callback's task, or cancel the batch's callback)",
            pk,
            text,
            exc_info=exc,
        )


def _enqueue_callback(found: JobBatch, summary: dict[str, Any]) -> Any:
    from django_outbox.jobs.backend import load_task

    task = load_task(found.callback_path)
    token = _current.set(None)  # the callback is not a job of any batch
    try:
        result = task.enqueue(**found.callback_kwargs, batch=summary)
    finally:
        _current.reset(token)
    return result.id


def sweep(using: str, limit: int = 100) -> int:
    """Complete open batches none of whose jobs is READY or RUNNING any more (their
    last finisher died before completing them, or an operator finished jobs)."""
    active = Job.objects.using(using).filter(batch_id=OuterRef("pk"), state__in=ACTIVE_STATES)
    done = (
        JobBatch.objects.using(using)
        .filter(finished_at__isnull=True)
        .exclude(Exists(active))
        .order_by("created_at")
        .values_list("pk", flat=True)[:limit]
    )
    return complete(using, list(done))


__all__ = ["OpenBatch", "batch", "complete", "current", "sweep"]
