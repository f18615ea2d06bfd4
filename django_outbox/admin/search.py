"""The search box of the three lists, answered through an index at millions of rows.

Django's ``search_fields`` would OR every field together, case-insensitively
(``UPPER(col) = UPPER(…)``, ``UPPER(col) LIKE UPPER(…)``): no index serves that, and
the page and its count each read the whole table (1.6-4.0 s at 5 million rows). Here
a term is read in this order, and each reading is one index's:

1. **an id**: a UUID as a message id (outbox) or result id (jobs), any term as a
   sender's message id (inbox) or a job's unique key, matched exactly, case and all.
   When rows have it, they are shown alone (one probe of a unique index tells);
   when none has it, the term is read as below (a key may look like a UUID).
2. **``type:<start>``** (outbox, inbox): the rows whose type starts so. No index holds
   types (every ``send()`` would pay for one): the list is read in id order until a
   page is found, quick for a common type and a read of the whole table for one
   without rows. Narrow the list first (a state, a source or destination).
3. **anything else**: the part's own, through indexes on PostgreSQL, MariaDB/MySQL and
   SQLite (``case-sensitive`` on the first two; SQLite's ``LIKE`` ignores ASCII case):
   a correlation id, exactly, or the start of a key (outbox, inbox); the start of a
   task path (jobs).

Each part declares its readings (:class:`Search`); the admin's help text under the box
says what they are.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest

#: The prefix of a term searched by the start of the rows' type.
TYPE_PREFIX = "type:"

Reading = Callable[[QuerySet[Any], str], "QuerySet[Any] | None"]


def as_uuid(term: str) -> uuid.UUID | None:
    """*term* as a UUID (any case, with or without dashes or braces), else ``None``."""
    try:
        return uuid.UUID(term)
    except ValueError:
        return None


@dataclass(frozen=True)
class Search:
    """How one part's list reads its search box (see the module's docstring)."""

    #: The rows the term would name as an id, or ``None`` when it cannot be one. When
    #: they exist they are the results; else the term is read by :attr:`others`.
    ids: Reading
    #: The rows the term matches otherwise (through indexes).
    others: Callable[[QuerySet[Any], str], QuerySet[Any]]
    #: The field ``type:`` searches by its start (``None``: no ``type:`` search).
    type_field: str | None = None

    def results(self, queryset: QuerySet[Any], term: str) -> QuerySet[Any]:
        term = term.strip()
        if not term:
            return queryset
        if self.type_field is not None and term.startswith(TYPE_PREFIX):
            start = term.removeprefix(TYPE_PREFIX).strip()
            return queryset.filter(**{f"{self.type_field}__startswith": start})
        named = self.ids(queryset, term)
        # One probe of a unique index: a key or a correlation id may look like an id.
        if named is not None and named.exists():
            return named
        return self.others(queryset, term)


class IndexedSearch:
    """A ModelAdmin's search through its part's :class:`Search` instead of Django's
    ``search_fields`` (which only make the search box appear)."""

    search: Search

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        return self.search.results(queryset, search_term), False
