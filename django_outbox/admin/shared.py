"""What every part's admin shares: readable JSON and errors, error filters, read-only
rows, and a paginator that does not count huge tables. The operator actions are in
``admin.actions``, who holds a running row (and whether it is stuck) in ``admin.held``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Q, QuerySet
from django.http import HttpRequest
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
