"""Who holds a running row in the admin, and whether it is stuck (``engine.holding``):
the worker's name, its last heartbeat, when the lease ends and when the attempt
started, in the list and on a row's page, and a filter for running and stuck rows.

A page of the list reads them in one query, and only when it shows a row a worker
holds: the cost does not grow with the page, let alone the table."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from django_outbox.admin.shared import LargeTableChangeList
from django_outbox.engine import holding, operator


class HolderChangeList(LargeTableChangeList):
    """A changelist page that reads who holds its rows in one query (and counts them as
    ``LargeTableChangeList`` does)."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.model_admin.note_holders(self.result_list)  # type: ignore[attr-defined]


class HeldFilter(admin.SimpleListFilter):
    """Rows a worker holds: running, or stuck (waiting for a rescue)."""

    title = "worker"
    parameter_name = "held"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Sequence[tuple[str, str]]:
        return (
            ("running", "running: a live worker holds it"),
            ("stuck", "stuck: lease ran out or worker silent"),
        )

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        part = operator.part_for(queryset.model, queryset.db)
        if self.value() == "running":
            return queryset.filter(holding.running(part))
        if self.value() == "stuck":
            return queryset.filter(holding.stuck(part))
        return queryset


class HeldRows:
    """Who holds a running row, and whether it is stuck, in the list and on its page: the
    worker's name, its last heartbeat, when the lease ends and when the current attempt
    started. A page of the list reads them in one query, and only when it shows a row a
    worker holds."""

    #: The row's field stamped when its attempt started.
    attempt_field = "attempted_at"

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[LargeTableChangeList]:
        return HolderChangeList

    def note_holders(self: Any, rows: Iterable[Any]) -> None:
        rows = list(rows)
        if not rows:
            return
        part = operator.part_for(self.model, rows[0]._state.db)
        found = holding.holders(part, [row.pk for row in rows if _maybe_held(part, row)])
        for row in rows:
            row._outbox_holder = found.get(row.pk)

    def holder_of(self: Any, obj: Any) -> holding.Holder | None:
        if not hasattr(obj, "_outbox_holder"):
            self.note_holders([obj])
        return obj._outbox_holder  # type: ignore[no-any-return]

    def _attempt(self, obj: Any, *, short: bool = False) -> str:
        """When the current attempt started (a claimed row may not have started yet)."""
        holder = self.holder_of(obj)
        started = holder.attempt_started if holder is not None else None
        if started is None:
            return "not started yet"
        return f"attempt since {when(started, short=short)}"

    @admin.display(description="held by")
    def held_by(self, obj: Any) -> str:
        """The list's column: the worker, a stuck marker, and below, when the attempt
        started, when the lease ends and how long ago the worker beat."""
        holder = self.holder_of(obj)
        if holder is None:
            return "—"
        marker = mark_safe("")
        if holder.stuck:
            marker = format_html(
                ' <strong class="outbox-stuck" style="color: #ba2121" title="{}">stuck</strong>',
                holder.stuck,
            )
        return format_html(
            '<span style="white-space: nowrap">{}{}</span><br><small style="white-space: '
            'nowrap">{}<br>lease to {}<br>beat {}</small>',
            _worker_name(holder),
            marker,
            self._attempt(obj, short=True),
            when(holder.lease_ends, short=True),
            ago(holder.silent_for),
        )

    @admin.display(description="held by")
    def held_by_detail(self, obj: Any) -> str:
        """The page's field: the worker (name and id), running or stuck, and why."""
        holder = self.holder_of(obj)
        if holder is None:
            return "— (no worker holds it)"
        name = _worker_name(holder)
        if holder.worker is not None:
            name = f"{name} ({holder.worker})"
        if holder.stuck:
            return format_html(
                '{} <strong class="outbox-stuck" style="color: #ba2121">stuck</strong>: {}',
                name,
                holder.stuck,
            )
        return format_html("{}: running, {}", name, self._attempt(obj))

    @admin.display(description="worker's last heartbeat")
    def worker_heartbeat(self, obj: Any) -> str:
        holder = self.holder_of(obj)
        if holder is None or holder.heartbeat_at is None:
            return "—"
        return f"{when(holder.heartbeat_at)} ({ago(holder.silent_for)})"

    @admin.display(description="lease ends")
    def lease_ends(self, obj: Any) -> str:
        return when(obj.locked_until)

    @admin.display(description="attempt started")
    def attempt_started(self, obj: Any) -> str:
        holder = self.holder_of(obj)
        if holder is not None and holder.attempt_started is not None:
            return f"{when(holder.attempt_started)} (running)"
        started = getattr(obj, self.attempt_field)
        if started is None:
            return "—"
        return f"{when(started)} (the last attempt; it has ended)"


def _maybe_held(part: Any, row: Any) -> bool:
    """Whether *row* may be held (the query decides, by the database's clock)."""
    life = part.lifecycle
    if life.running is None:
        return bool(row.state == life.ready and row.locked_until is not None)
    return bool(row.state == life.running)


def _worker_name(holder: holding.Holder) -> str:
    if holder.name is not None:
        return holder.name
    if holder.worker is None:
        return "a process without a heartbeat"
    return "a worker that is gone"


def when(moment: datetime | None, *, short: bool = False) -> str:
    """A time to the second, in the current time zone (*short*: the time alone when it
    is today), or a dash."""
    if moment is None:
        return "—"
    local = timezone.localtime(moment)
    if short and local.date() == timezone.localdate():
        return local.strftime("%H:%M:%S")
    return local.strftime("%Y-%m-%d %H:%M:%S")


def ago(age: timedelta | None) -> str:
    """*age* as "1.2 s ago", "95 s ago", "12 min ago"."""
    if age is None:
        return "never"
    seconds = age.total_seconds()
    if seconds < 10:
        return f"{max(seconds, 0):.1f} s ago"
    if seconds < 300:
        return f"{seconds:.0f} s ago"
    return f"{seconds / 60:.0f} min ago"
