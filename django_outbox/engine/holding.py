"""Who holds a row, and whether it is stuck: the rescue's rules, for people to read.

A row is *held* while a worker does its step: in lease mode it is in the part's
``running`` state under a lease; in lock mode (the inbox) it is still ready, with a
lease that has not run out. A held row is *stuck* when nobody works on it any more:
its lease ran out (lease mode; in lock mode the row is then simply due again), or
the worker that claimed it has not beaten for ``WORKER_TIMEOUT_SECONDS`` (or its
worker row is gone). The rescue takes such rows back (``engine.heartbeat``,
``engine.sweeps``); until it has, an operator sees them as stuck, not as running.

Everything is judged by the database's clock, in SQL: :func:`stuck` and
:func:`running` filter a list, :func:`holders` reads what the rows of one page need
in one query (the workers' names and heartbeats come with them, not one query per
row).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import (
    BooleanField,
    DurationField,
    Exists,
    ExpressionWrapper,
    OuterRef,
    Q,
    Subquery,
    Value,
)

from django_outbox.conf import get_settings
from django_outbox.engine import clock
from django_outbox.engine.lease import decode_ids
from django_outbox.engine.models import Worker
from django_outbox.engine.part import Part


@dataclass(frozen=True)
class Holder:
    """The worker holding a row, as the database saw it just now."""

    #: The claiming worker's id (``None``: a process without a heartbeat claimed it).
    worker: uuid.UUID | None
    #: Its name (``host:pid role``), ``None`` if its worker row is gone or it has none.
    name: str | None
    #: Its last heartbeat (database clock).
    heartbeat_at: datetime | None
    #: How long ago that was (by the database's clock).
    silent_for: timedelta | None
    #: When the row's lease runs out.
    lease_ends: datetime | None
    #: Why the row is stuck; empty while it is worked on.
    stuck: str = ""
    #: When the step started on the row (``None``: claimed, not started yet).
    attempt_started: datetime | None = None


def _silent_worker() -> Q:
    """Rows whose claiming worker has not beaten for ``WORKER_TIMEOUT_SECONDS`` (or whose
    worker row is gone)."""
    stale = clock.later(clock.now(), -get_settings().worker_timeout_seconds)
    alive = Worker.objects.filter(pk=OuterRef("claimed_by"), heartbeat_at__gte=stale)
    return Q(Q(claimed_by__isnull=False), ~Exists(alive))


def held(part: Part) -> Q:
    """Rows a worker holds now."""
    life = part.lifecycle
    if life.running is None:
        return Q(state=life.ready, locked_until__gte=clock.now())
    return Q(state=life.running)


def stuck(part: Part) -> Q:
    """Held rows nobody works on any more: waiting for a rescue."""
    if part.lifecycle.running is None:
        return held(part) & _silent_worker()
    return held(part) & (Q(locked_until__lt=clock.now()) | _silent_worker())


def running(part: Part) -> Q:
    """Held rows a live worker works on."""
    alive = ~_silent_worker()
    if part.lifecycle.running is None:
        return held(part) & alive
    return held(part) & Q(locked_until__gte=clock.now()) & alive


def holders(part: Part, ids: Iterable[Any]) -> dict[Any, Holder]:
    """The holder of each held row among primary keys *ids*, in one query (rows not held
    are left out)."""
    ids = list(ids)
    if not ids:
        return {}
    workers = Worker.objects.filter(pk=OuterRef("claimed_by"))
    lease_over: Any = Value(False)  # lock mode: a row whose lease ran out is not held
    if part.lifecycle.running is not None:
        lease_over = ExpressionWrapper(Q(locked_until__lt=clock.now()), output_field=BooleanField())
    rows = (
        part.model._default_manager.using(part.using)
        .filter(held(part), pk__in=ids)
        .annotate(
            worker_name=Subquery(workers.values("name")[:1]),
            worker_beat=Subquery(workers.values("heartbeat_at")[:1]),
            beat_age=ExpressionWrapper(
                clock.now() - Subquery(workers.values("heartbeat_at")[:1]),
                output_field=DurationField(),
            ),
            lease_over=lease_over,
            worker_silent=ExpressionWrapper(_silent_worker(), output_field=BooleanField()),
            worker_token=Subquery(workers.values("attempt_token")[:1]),
            worker_declared=Subquery(workers.values("attempt_ids")[:1]),
            worker_started=Subquery(workers.values("attempt_started_at")[:1]),
        )
        .values_list(
            "pk",
            "claimed_by",
            "locked_until",
            "worker_name",
            "worker_beat",
            "beat_age",
            "lease_over",
            "worker_silent",
            "lock_token",
            "attempt_open",
            part.attempted_at_field,
            "worker_token",
            "worker_declared",
            "worker_started",
        )
    )
    found = {}
    for (
        pk, worker, lease_ends, name, beat, age, over, silent,
        token, marked, attempted_at, worker_token, worker_declared, worker_started,
    ) in rows:  # fmt: skip
        started = attempted_at if marked else None
        # Or declared on its worker's row (one write per window of starts).
        declared = worker_token is not None and worker_token == token
        if started is None and declared and str(pk) in decode_ids(worker_declared or ""):
            started = worker_started
        found[pk] = Holder(
            worker=worker,
            name=name,
            heartbeat_at=beat,
            silent_for=age,
            lease_ends=lease_ends,
            stuck=_why(lease_over=bool(over), silent=bool(silent), gone=name is None),
            attempt_started=started,
        )
    return found


def _why(*, lease_over: bool, silent: bool, gone: bool) -> str:
    if silent and gone:
        return "its worker is gone (no worker row): waiting for a rescue"
    if silent:
        timeout = get_settings().worker_timeout_seconds
        return f"its worker has not beaten for over {timeout:g} s: waiting for a rescue"
    if lease_over:
        return "its lease ran out: waiting for the sweep's rescue"
    return ""


__all__ = ["Holder", "held", "holders", "running", "stuck"]
