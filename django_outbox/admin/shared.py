"""What every part's admin shares: readable JSON and errors, error filters, read-only
rows, and a list page and paginator that do not count huge tables. The operator actions are in
``admin.actions``, who holds a running row (and whether it is stuck) in ``admin.held``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db import OperationalError, connections, transaction
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


#: How long a filtered list may spend counting its matches on PostgreSQL, in
#: milliseconds: a filter that few rows match and no index serves would read millions.
COUNT_BUDGET_MS = 100


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Counts without reading huge tables: an unfiltered PostgreSQL table from its
    statistics instead of ``COUNT(*)`` ("about"), a filtered list up to ``COUNT_CAP``
    matches, on PostgreSQL for at most ``COUNT_BUDGET_MS`` ("more than": page links
    stop at what is known). The list's page tells it what it saw (:meth:`saw`): a page
    that holds the last match gives the exact count, and nothing is counted."""

    #: How the count is shown: ``"exact"``, ``"about"`` or ``"more than"``.
    precision = "exact"
    #: The fewest rows the list has (what its page saw).
    known = 0

    def saw(self, rows: int, *, last: bool) -> None:
        """The page found *rows* rows up to and including its own; *last*: none after."""
        self.known = rows
        if last:
            self.__dict__["count"] = rows

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return super().count
        if queryset.query.where:
            counted = count_within_budget(queryset.order_by()[: COUNT_CAP + 1])
            if counted is None or counted > COUNT_CAP:
                # Past the cap or the budget: the links reach the next page at least.
                self.precision = "more than"
                return max(counted or 0, self.known)
            return max(counted, self.known)
        connection = connections[queryset.db]
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                    [queryset.model._meta.db_table],
                )
                row = cursor.fetchone()
            if row and row[0] > COUNT_CAP:
                self.precision = "about"
                return max(int(row[0]), self.known)
        return super().count

    @property
    def count_text(self) -> str:
        """The count for people: ``42``, ``about 5,000,000``, ``more than 10,000``."""
        if self.precision == "more than":
            return f"more than {max(self.count - 1, 0):,}"
        if self.precision == "about":
            return f"about {self.count:,}"
        return f"{self.count:,}"


def count_within_budget(capped: QuerySet[Any]) -> int | None:
    """``capped.count()``, or ``None`` when PostgreSQL cannot count it within
    ``COUNT_BUDGET_MS`` (the statement is cancelled: ``SET LOCAL statement_timeout`` in
    a savepoint, the previous timeout restored). Other databases count it whole."""
    connection = connections[capped.db]
    if connection.vendor != "postgresql":
        return int(capped.count())
    with transaction.atomic(using=capped.db):
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('statement_timeout')")
            (previous,) = cursor.fetchone()
            cursor.execute(
                "SELECT set_config('statement_timeout', %s, true)", [f"{COUNT_BUDGET_MS}ms"]
            )
        try:
            with transaction.atomic(using=capped.db):
                return int(capped.count())
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != "57014":  # query_canceled
                raise
            return None
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('statement_timeout', %s, true)", [previous])


class LargeTableChangeList(ChangeList):
    """A list page that reads its rows before it counts them: a page with the last
    match knows the count (a filter matching nothing is read once, not twice), and
    only a list longer than the page is counted (``EstimatedCountPaginator``)."""

    def get_results(self, request: HttpRequest) -> None:
        if self.show_all or self.page_num < 1:
            # Django's: "show all" (at most list_max_show_all rows), or its answer to a
            # page number that is not one.
            super().get_results(request)
            return
        per_page = self.list_per_page
        offset = (self.page_num - 1) * per_page
        rows = list(self.queryset[offset : offset + per_page + 1])
        if not rows and self.page_num > 1:
            raise IncorrectLookupParameters
        paginator = self.model_admin.get_paginator(request, self.queryset, per_page)
        last = len(rows) <= per_page
        seen = offset + min(len(rows), per_page)
        if isinstance(paginator, EstimatedCountPaginator):
            paginator.saw(seen + (0 if last else 1), last=last)
        result_count = paginator.count
        show_full = self.model_admin.show_full_result_count
        full_result_count = self.root_queryset.count() if show_full else None
        self.result_count = result_count
        self.show_full_result_count = show_full
        self.show_admin_actions = not show_full or bool(full_result_count)
        self.full_result_count = full_result_count
        self.result_list = rows[:per_page]
        self.can_show_all = result_count <= self.list_max_show_all
        self.multi_page = result_count > per_page
        self.paginator = paginator


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
