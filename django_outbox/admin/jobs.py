"""Admin for background jobs: Django's statuses, arguments, results and each attempt's
traceback, who runs a job (and whether it is stuck); guarded and logged retry, cancel
and skip on the list and on a job's page."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html, format_html_join

from django_outbox.admin.actions import OperatorActions
from django_outbox.admin.held import HeldFilter, HeldRows
from django_outbox.admin.search import IndexedSearch, Search, as_uuid
from django_outbox.admin.shared import (
    AttemptsFilter,
    EstimatedCountPaginator,
    HasErrorFilter,
    ReadOnlyRows,
    pretty_json,
    pretty_text,
)
from django_outbox.engine.operator import Verb
from django_outbox.jobs.models import Job, JobState


def _by_result_id_or_unique_key(rows: QuerySet[Job], term: str) -> QuerySet[Job]:
    result_id = as_uuid(term)
    if result_id is None:
        return rows.filter(unique_key=term)
    return rows.filter(Q(result_id=result_id) | Q(unique_key=term))


def _by_task_path(rows: QuerySet[Job], term: str) -> QuerySet[Job]:
    return rows.filter(task_path__startswith=term)


#: A result id or a unique key (their indexes); else the start of a task path.
JOB_SEARCH = Search(ids=_by_result_id_or_unique_key, others=_by_task_path)


class QueueFilter(admin.SimpleListFilter):
    """The queues jobs were enqueued on (a small, distinct set)."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        from django_outbox.jobs import compat

        queues: set[str] = set()
        for backend in compat.task_backends.all():
            queues |= set(getattr(backend, "queues", ()) or ())
        return [(q, q) for q in sorted(queues or {"default"})]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(queue_name=value) if value else queryset


@admin.register(Job)
class JobAdmin(
    IndexedSearch,
    OperatorActions,
    HeldRows,
    ReadOnlyRows,
    admin.ModelAdmin,  # type: ignore[type-arg]
):
    part_name = "jobs"
    operator_noun = "job"
    attempt_field = "last_attempted_at"
    # A row's page: a button for each action its state allows (OperatorActions).
    change_form_template = "django_outbox/admin/change_form.html"
    consequences = {
        Verb.CANCEL: "a cancelled job never runs (a running one is asked to stop), and this "
        "cannot be undone",
        Verb.SKIP: "a skipped job stays FAILED for good, and the later jobs of its serial key run",
    }
    list_display = (
        "id",
        "task_path",
        "state",
        "held_by",
        "queue_name",
        "priority",
        "attempts",
        "error",
        "created_at",
        "finished_at",
    )
    list_filter = (
        "state",
        HeldFilter,
        QueueFilter,
        HasErrorFilter,
        AttemptsFilter,
        ("created_at", admin.DateFieldListFilter),
    )
    # Shows the search box; JOB_SEARCH reads it (admin.search).
    search_fields = ("result_id", "unique_key", "task_path")
    search = JOB_SEARCH
    search_help_text = (
        "A result id or a unique key (exact, case-sensitive), or the start of a task path "
        "(case-sensitive)."
    )
    list_per_page = 100
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    actions = ("retry_jobs", "cancel_jobs", "skip_jobs")
    fieldsets = (
        (None, {"fields": ("result_id", "task_path", "state", "resolution")}),
        ("Call", {"fields": ("args_pretty", "kwargs_pretty", "queue_name", "priority")}),
        (
            "Options",
            {
                "fields": (
                    "max_attempts",
                    "unique_key",
                    "serial_key",
                    "sequence",
                    "blocked",
                    "blocking",
                    "cancel_requested",
                )
            },
        ),
        (
            "Runs",
            {
                "fields": (
                    "attempts",
                    "available_at",
                    "return_value_pretty",
                    "last_error_pretty",
                    "attempt_errors",
                    "workers",
                    "created_at",
                    "started_at",
                    "finished_at",
                )
            },
        ),
        (
            "Worker",
            {
                "fields": (
                    "held_by_detail",
                    "worker_heartbeat",
                    "lease_ends",
                    "attempt_started",
                    "claimed_by",
                )
            },
        ),
    )
    readonly_fields = tuple(str(name) for _, section in fieldsets for name in section["fields"])

    @admin.display(description="args")
    def args_pretty(self, obj: Job) -> str:
        return pretty_json(obj.args)

    @admin.display(description="kwargs")
    def kwargs_pretty(self, obj: Job) -> str:
        return pretty_json(obj.kwargs)

    @admin.display(description="return value")
    def return_value_pretty(self, obj: Job) -> str:
        return pretty_json(obj.return_value) if obj.state == JobState.SUCCESSFUL else "—"

    @admin.display(description="errors, one per failed attempt")
    def attempt_errors(self, obj: Job) -> str:
        if not obj.errors:
            return "—"
        return format_html_join(
            "",
            "<p><strong>attempt {} · {}</strong> ({})</p>{}",
            (
                (
                    e.get("attempt", "?"),
                    e.get("exception_class_path", ""),
                    e.get("worker_id", ""),
                    pretty_text(str(e.get("traceback", ""))),
                )
                for e in obj.errors
            ),
        )

    @admin.display(description="workers, one per attempt")
    def workers(self, obj: Job) -> str:
        return format_html("{}", ", ".join(str(w) for w in obj.worker_ids or []) or "—")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_outbox.retry_job")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_outbox.cancel_job")

    def has_skip_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_outbox.skip_job")

    @admin.action(
        description="Retry selected failed jobs (FAILED → READY, attempts reset)",
        permissions=["retry"],
    )
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        return self.operate(request, queryset, "retry")

    @admin.action(
        description="Cancel selected jobs… (READY ones never run; RUNNING ones are asked to stop)",
        permissions=["cancel"],
    )
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        return self.operate(request, queryset, "cancel")

    @admin.action(
        description="Skip selected failed jobs… (their serial key's later jobs may run)",
        permissions=["skip"],
    )
    def skip_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        return self.operate(request, queryset, "skip")
