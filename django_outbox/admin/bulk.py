"""Operator actions on large selections: bounded steps, progress, one history entry.

An action on "all N matching" a filter used to move every row in one request and one
transaction, with a history entry per row: 100,000 failed messages took 13.4 s (7.7 s
of it history), near a proxy's 30 s timeout, with nothing shown meanwhile. Past
``BULK_ROWS`` selected rows, the admin works in steps instead:

- a step moves the selection's rows in primary-key order, ``operator.CHUNK`` at a
  time, each chunk one committed operator action (its rows locked, its runners
  triggered), until none remain or ``STEP_SECONDS`` have passed; it remembers the
  last row id it reached;
- if rows remain, the answer is a progress page whose form posts the same action on
  the same list (filters and search are in its URL) from that row id on; it submits
  itself, or the operator presses Continue. Each step is a new request: its
  permissions are checked again, and none holds a request past about
  ``STEP_SECONDS`` plus one chunk;
- one history entry (``LogEntry``, no object: it names the list's filter) records the
  action, updated after each step with how many rows moved so far.

If the page is closed midway, nothing is lost: what moved is committed and recorded,
and the same action on the same filter moves the rest, since actions move only rows
still in their source states (``outbox_requeue``, ``inbox_requeue`` and
``jobs_requeue`` do it from a shell for requeue/retry).

Why not hand the rest to a background job: the selection is the admin's (any filter,
the search, the user's permissions), which a job would have to rebuild from a
serialized copy, and a job would need the app's jobs backend and a worker running.
The steps need neither, and show their progress.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest

from django_outbox.engine import operator

#: A selection with more rows than this is moved in steps, with one history entry.
BULK_ROWS = 2_000
#: How long one request moves rows before it answers with its progress, in seconds.
STEP_SECONDS = 5.0
#: Query parameters of a list that are not its filter.
NOT_FILTERS = frozenset({"p", "o", "all", "e", "_changelist_filters", "_to_field", "_popup"})


@dataclass
class Step:
    """What one step did."""

    #: Rows moved, and running rows asked to stop.
    moved: int = 0
    stopping: int = 0
    #: The last row id the step reached; ``None`` when the selection is done.
    after: int | None = None


def step(apply: Any, selection: QuerySet[Any], *, after: int, seconds: float | None = None) -> Step:
    """Apply *apply* (an ``Action.apply``) to the rows of *selection* past row id
    *after*, ``operator.CHUNK`` rows at a time in id order, each chunk committed on its
    own, until none remain or *seconds* (default ``STEP_SECONDS``) have passed."""
    deadline = time.monotonic() + (STEP_SECONDS if seconds is None else seconds)
    manager = selection.model._default_manager.using(selection.db)
    done = Step()
    ordered = selection.order_by("pk").values_list("pk", flat=True)
    while True:
        ids = list(ordered.filter(pk__gt=after)[: operator.CHUNK])
        if not ids:
            return done
        moved: operator.Moved = apply(manager.filter(pk__in=ids))
        done.moved += moved.count
        done.stopping += len(moved.stopping)
        after = ids[-1]
        if len(ids) < operator.CHUNK:
            return done
        if time.monotonic() >= deadline:
            done.after = after
            return done


def described(request: HttpRequest) -> str:
    """The list's filter and search, as the history and the operator read them."""
    parts = []
    for name, values in sorted(request.GET.lists()):
        if name in NOT_FILTERS:
            continue
        shown = ", ".join(values)
        parts.append(f"search {shown!r}" if name == "q" else f"{name}={shown}")
    return "; ".join(parts) or "no filter (every row)"


def carried(post: Mapping[str, Any], name: str) -> int:
    """A whole number a progress page carries from step to step (0 when absent or not
    one: the numbers only count, a forged one moves nothing it could not)."""
    value = str(post.get(name) or "0")
    return min(int(value), 2**63 - 1) if value.isascii() and value.isdigit() else 0
