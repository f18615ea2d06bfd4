"""What every part's admin shares: readable JSON and errors, error filters, operator
actions that are logged and confirmed, and a paginator that does not count huge tables.

The outbox admin uses it today; the inbox and jobs admins are built from the same pieces.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.functional import cached_property
from django.utils.html import format_html

#: Wraps long lines: the admin's ``.form-row { overflow: hidden }`` would clip them.
_PRE = '<pre style="white-space: pre-wrap; overflow-wrap: anywhere; margin: 0">{}</pre>'
#: Characters of the error shown in the list.
SHORT_ERROR_CHARS = 80


def pretty_json(value: Any) -> str:
    """JSON for people: indented, keys sorted, non-ASCII text as it is."""
    text = json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)
    return format_html(_PRE, text)


def pretty_text(text: str) -> str:
    """A long text (an error with its traceback), wrapped, never clipped."""
    return format_html(_PRE, text or "—")


def short_error(text: str) -> str:
    """The first line of an error, cut to ``SHORT_ERROR_CHARS`` characters."""
    first = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return first if len(first) <= SHORT_ERROR_CHARS else first[: SHORT_ERROR_CHARS - 1] + "…"


class HasErrorFilter(admin.SimpleListFilter):
    """Rows with or without a recorded error."""

    title = "error"
    parameter_name = "has_error"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Sequence[tuple[str, str]]:
        return (("yes", "has an error"), ("no", "no error"))

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return queryset.exclude(last_error="")
        if self.value() == "no":
            return queryset.filter(last_error="")
        return queryset


class AttemptsFilter(admin.SimpleListFilter):
    """Rows by how many attempts they took."""

    title = "attempts"
    parameter_name = "attempts"
    ranges: dict[str, tuple[str, Q]] = {
        "0": ("none", Q(attempts=0)),
        "1": ("1", Q(attempts=1)),
        "2-5": ("2 to 5", Q(attempts__gte=2, attempts__lte=5)),
        "6+": ("6 or more", Q(attempts__gte=6)),
    }

    def lookups(self, request: HttpRequest, model_admin: Any) -> Sequence[tuple[str, str]]:
        return [(value, label) for value, (label, _) in self.ranges.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        chosen = self.ranges.get(self.value() or "")
        return queryset.filter(chosen[1]) if chosen else queryset


#: A filtered list counts its matches up to here, no further.
COUNT_CAP = 10_000


class ConfiguredValuesFilter(admin.SimpleListFilter):
    """A filter whose choices come from the settings, not from ``SELECT DISTINCT``: a
    plain field filter reads the whole table on every list page (1.3 s at 5 million
    rows on PostgreSQL)."""

    field_name = ""

    def values(self) -> Sequence[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> Sequence[tuple[str, str]]:
        return [(value, value) for value in sorted(self.values())]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value():
            return queryset.filter(**{self.field_name: self.value()})
        return queryset


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Counts without reading huge tables: an unfiltered PostgreSQL table from its
    statistics instead of ``COUNT(*)``, a filtered list up to ``COUNT_CAP`` matches
    (page links are approximate beyond that)."""

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if isinstance(queryset, QuerySet) and queryset.query.where:
            return int(queryset.order_by()[: COUNT_CAP + 1].count())
        if isinstance(queryset, QuerySet) and not queryset.query.where:
            connection = connections[queryset.db]
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                        [queryset.model._meta.db_table],
                    )
                    row = cursor.fetchone()
                if row and row[0] > 10_000:
                    return int(row[0])
        return super().count


class ReadOnlyRows:
    """Rows that the part's own code writes: no add, change or delete in the admin
    (operators act through the guarded actions; rows leave through the purge). Also
    the columns every part's rows have: the last error, short and in full."""

    @admin.display(description="last error")
    def error(self, obj: Any) -> str:
        return short_error(obj.last_error)

    @admin.display(description="last error")
    def last_error_pretty(self, obj: Any) -> str:
        return pretty_text(obj.last_error)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class OperatorActions:
    """Requeue / cancel / skip for a part's ModelAdmin: filtered to the allowed source
    states by the domain methods, logged in the admin's history, final ones confirmed."""

    #: Actions that cannot be undone ask for confirmation first.
    confirmed_verbs: tuple[str, ...] = ("cancel",)
    #: What the rows are called in messages to the operator.
    operator_noun = "message"
    #: The engine part whose sweep the changelist reports on.
    part_name = ""

    def changelist_view(
        self: Any, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The list, with a warning at the top when the part's sweeps have stopped."""
        from django_outbox.engine.sweeps import stale_sweeps

        if request.method == "GET":
            for found in stale_sweeps(self.model._default_manager.db):
                if found.part == self.part_name:
                    self.message_user(request, found.describe(), messages.WARNING)
        return super().changelist_view(request, extra_context)  # type: ignore[misc,no-any-return]

    def apply_operator_action(
        self: Any,
        request: HttpRequest,
        queryset: QuerySet[Any],
        *,
        verb: str,
        past: str,
        allowed: Sequence[str],
        apply: Callable[[QuerySet[Any]], int],
        confirmed: bool = False,
    ) -> HttpResponse | None:
        """Apply *apply* to *queryset*; for a final verb, first ask (unless *confirmed*)."""
        confirmed = confirmed or bool(request.POST.get("confirmed"))
        if verb in self.confirmed_verbs and not confirmed:
            return TemplateResponse(
                request,
                "django_outbox/admin/confirm_action.html",
                {
                    **self.admin_site.each_context(request),
                    "title": f"Are you sure you want to {verb} these?",
                    "verb": verb,
                    "objects": queryset[:100],
                    "count": queryset.count(),
                    "action": request.POST.get("action", ""),
                    "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
                    "opts": self.model._meta,
                },
            )
        selected = queryset.count()
        # The rows that will move: logged once the domain method has moved them.
        eligible = list(queryset.filter(state__in=allowed).values_list("pk", flat=True))
        moved = apply(queryset.order_by())
        if moved:
            LogEntry.objects.log_actions(
                user_id=request.user.pk,  # type: ignore[arg-type]
                queryset=self.model._default_manager.using(queryset.db).filter(pk__in=eligible),
                action_flag=CHANGE,
                change_message=f"{past.capitalize()} through the admin.",
            )
        noun = self.operator_noun
        self.message_user(request, f"{moved} {noun}(s) {past}.", messages.SUCCESS)
        if moved < selected:
            states = ", ".join(str(s) for s in allowed)
            self.message_user(
                request,
                f"{selected - moved} {noun}(s) skipped: only those in {states} can be {past}.",
                messages.WARNING,
            )
        return None
