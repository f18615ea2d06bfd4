"""Rows in every condition the health figures report, for the health tests: made directly
in the tables (as the workers would have left them), at times relative to a pinned
``now``."""

from __future__ import annotations

import itertools
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

from django_outbox.engine import clock
from django_outbox.engine.models import MinuteCount, SweepMark, Worker
from django_outbox.inbox.models import InboxMessage, InboxState
from django_outbox.jobs.models import Job, JobBatch, JobState, Resolution
from django_outbox.outbox.models import OutboxMessage, OutboxState

_sequence = itertools.count(1)


def ago(now: datetime, seconds: float) -> datetime:
    return now - timedelta(seconds=seconds)


def outbox(now: datetime, state: str = OutboxState.SHOULD_BE_SENT, **fields: Any) -> Any:
    """An outgoing message in *state*, with what that state requires."""
    fields.setdefault("available_at", now)
    if state in (OutboxState.SENT, OutboxState.CANCELLED):
        fields.setdefault("finished_at", now)
    if state == OutboxState.SENT:
        fields.setdefault("sent_at", now)
    if state == OutboxState.SENDING:
        fields.setdefault("locked_until", now + timedelta(seconds=60))
        fields.setdefault("lock_token", uuid.uuid4())
    if fields.get("key") is not None:
        fields.setdefault("sequence", next(_sequence))
    fields.setdefault("destination", "default")
    return OutboxMessage.objects.create(type="order.created", payload={}, state=state, **fields)


def inbox(now: datetime, state: str = InboxState.SHOULD_BE_HANDLED, **fields: Any) -> Any:
    fields.setdefault("available_at", now)
    if state in (InboxState.HANDLED, InboxState.SKIPPED):
        fields.setdefault("finished_at", now)
    fields.setdefault("source", "shop")
    return InboxMessage.objects.create(
        message_id=str(uuid.uuid4()), type="order.paid", payload={}, state=state, **fields
    )


def job(now: datetime, state: str = JobState.READY, **fields: Any) -> Any:
    fields.setdefault("available_at", now)
    if state in (JobState.SUCCESSFUL, JobState.FAILED):
        fields.setdefault("finished_at", now)
    if state == JobState.RUNNING:
        fields.setdefault("locked_until", now + timedelta(seconds=60))
        fields.setdefault("lock_token", uuid.uuid4())
    fields.setdefault("task_path", "testproject.shop.jobs.noop")
    return Job.objects.create(state=state, **fields)


def failed_job(now: datetime, exception: str, **fields: Any) -> Any:
    """A FAILED job whose last attempt raised *exception* (a class path)."""
    short = exception.rsplit(".", 1)[-1]
    entry = {"exception_class_path": exception, "traceback": "...", "attempt": 1}
    fields.setdefault("last_error", f"{short}: it broke")
    fields.setdefault("last_attempted_at", now)
    return job(now, JobState.FAILED, errors=[entry], **fields)


def worker(now: datetime, role: str = "outbox", *, silent: float = 0.2, **fields: Any) -> Worker:
    """A worker row that last beat *silent* seconds before *now*."""
    beat = ago(now, silent)
    return Worker.objects.create(
        name=f"host:{next(_sequence)} {role}",
        started_at=ago(now, silent + 60),
        heartbeat_at=beat,
        healthy_since=ago(now, silent + 60),
        **fields,
    )


def swept(now: datetime, part: str, seconds_ago: float) -> None:
    SweepMark.objects.update_or_create(
        part=part, defaults={"last_run_at": ago(now, seconds_ago), "ran_by": "host:1"}
    )


def counted(now: datetime, part: str, event: str, count: int, *, minutes_ago: int = 0) -> None:
    """*count* outcomes of *part* in the minute *minutes_ago* before *now*'s."""
    minute = datetime.fromtimestamp((int(now.timestamp()) // 60 - minutes_ago) * 60, tz=UTC)
    MinuteCount.objects.create(part=part, minute=minute, event=event, count=count)


def open_batch(now: datetime) -> JobBatch:
    return JobBatch.objects.create(total=3, created_at=now)


def pinned_now() -> datetime:
    """The current time, to the microsecond."""
    return timezone.now()


def early_in_a_minute(needed: float = 30) -> datetime:
    """The current time, at least *needed* seconds before its minute ends: waits for
    the next minute when fewer are left.

    For a page rendered seconds after its rows were made (a browser logs in first): a
    minute that turns in between moves every count of its chart one minute to the
    left. The page reads the database's clock, and judges holders by it in SQL, so
    the clock cannot be pinned: the test starts early in a minute instead."""
    moment = clock.read_now("default")
    left = 60 - moment.timestamp() % 60
    if left < needed:
        time.sleep(left + 0.05)
        moment = clock.read_now("default")
    return moment


__all__ = [
    "Resolution",
    "ago",
    "counted",
    "early_in_a_minute",
    "failed_job",
    "inbox",
    "job",
    "open_batch",
    "outbox",
    "pinned_now",
    "swept",
    "worker",
]
