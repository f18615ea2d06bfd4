"""Failed rows grouped by cause, and the operator actions on a whole group.

A failed row (the outbox's ``send_error``, the inbox's ``handle_error``, a FAILED job
no operator has resolved) waits for a person. A hundred rows that failed for one
reason are one problem: they are grouped by their *kind* of error and by where they
were going or came from (destination, source, task path). The kind is the exception
class where it is recorded (a job's last ``errors`` entry, an error or traceback whose
last line reads ``module.Class: text``), else the error's last line with the parts
that differ from row to row (numbers of four digits or more, UUIDs, long hex strings)
blotted out: the outbox records a transport's message, not its class.

Groups are read from the newest ``FAILED_SAMPLE`` failed rows of a part (through its
partial index of failed rows, newest first): a group's count is "of the newest N"
when there are more. An action on a group (requeue, cancel, skip: the part's own,
``engine.operator``) finds the group's rows anew, newest first, and moves at most
``ACTION_LIMIT`` of them per call, ``operator.CHUNK`` per transaction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import CharField, F, Func, QuerySet

from django_outbox.engine import operator
from django_outbox.engine.part import Part

#: Failed rows read to make the groups.
FAILED_SAMPLE = 1_000
#: Rows one group action moves at most (the rest: run it again).
ACTION_LIMIT = 10_000
#: Failed rows an action reads at most while looking for its group's rows.
SCAN_LIMIT = 100_000
#: Characters of the example error kept.
EXAMPLE_CHARS = 500
#: What a part's failed rows are grouped by besides their error.
TARGETS = {"outbox": "destination", "inbox": "source", "jobs": "task_path"}

_CLASS = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Z]\w*)(?::\s|:$|$)")
_VOLATILE = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"|\b(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{12,}\b"
    r"|\d{4,}"
)
#: Characters of an error's last line kept as its kind.
KIND_CHARS = 120


def error_kind(text: str) -> str:
    """What kind of error *text* records: the exception class its last line names
    (``ValueError``, ``httpx.HTTPStatusError``), else that line with its volatile parts
    blotted out (``order … not found``)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return "(no error recorded)"
    last = lines[-1]
    named = _CLASS.match(last)
    if named:
        return named.group(1)
    return _VOLATILE.sub("…", last)[:KIND_CHARS]


class LastExceptionClass(Func):
    """SQL: the ``exception_class_path`` of the last entry of a job's ``errors`` list."""

    output_field = CharField()
    arity = 1

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        sql, params = compiler.compile(self.source_expressions[0])
        return f"(({sql}) -> -1 ->> 'exception_class_path')", params

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        sql, params = compiler.compile(self.source_expressions[0])
        return f"json_extract({sql}, '$[#-1].exception_class_path')", params

    def as_mysql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        sql, params = compiler.compile(self.source_expressions[0])
        return (
            f"(CASE WHEN JSON_LENGTH({sql}) > 0 THEN JSON_UNQUOTE(JSON_EXTRACT({sql}, "
            f"CONCAT('$[', JSON_LENGTH({sql}) - 1, '].exception_class_path'))) END)",
            (*params, *params, *params),
        )


@dataclass(frozen=True)
class FailureGroup:
    """Failed rows of one part with one kind of error, going to (or coming from, or run
    by) one place."""

    part: str
    kind: str
    #: The destination, source or task path.
    target: str
    count: int
    #: When the attempts of the oldest and the newest of them started.
    first_seen: datetime | None
    last_seen: datetime | None
    #: The newest one's error, and its primary key.
    example: str
    example_id: Any

    @property
    def target_field(self) -> str:
        return TARGETS[self.part]

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            self.target_field: self.target,
            "count": self.count,
            "first_seen": self.first_seen.isoformat() if self.first_seen else None,
            "last_seen": self.last_seen.isoformat() if self.last_seen else None,
            "example": self.example,
            "example_id": self.example_id,
        }


@dataclass(frozen=True)
class Failures:
    """A part's failure groups, most rows first, from the newest ``examined`` failed
    rows (``capped``: there may be more)."""

    groups: tuple[FailureGroup, ...] = ()
    examined: int = 0
    capped: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "examined": self.examined,
            "capped": self.capped,
            "groups": [group.as_dict() for group in self.groups],
        }


def failed_rows(part: Part) -> QuerySet[Any]:
    """*part*'s failed rows that wait for an operator (a job an operator cancelled or
    skipped is FAILED too, but resolved)."""
    rows = part.model._default_manager.using(part.using).filter(state=part.lifecycle.failed)
    if part.name == "jobs":
        rows = rows.filter(resolution="")
    return rows


def _described(part: Part, rows: QuerySet[Any]) -> QuerySet[Any]:
    """*rows* as the values a group is made of: primary key, target, error, class path
    (jobs) and when the last attempt started."""
    columns = ["pk", TARGETS[part.name], "last_error", part.attempted_at_field, "created_at"]
    if part.name == "jobs":
        rows = rows.annotate(class_path=LastExceptionClass(F("errors")))
        columns.append("class_path")
    return rows.values(*columns)


def kind_of(row: dict[str, Any]) -> str:
    """The kind of error of a failed row (as ``_described`` reads it)."""
    return row.get("class_path") or error_kind(row["last_error"])


def read(part: Part, *, sample: int | None = None) -> Failures:
    """The failure groups of the newest *sample* (``FAILED_SAMPLE``) failed rows of
    *part*."""
    sample = FAILED_SAMPLE if sample is None else sample
    rows = list(_described(part, failed_rows(part)).order_by("-pk")[: sample + 1])
    capped = len(rows) > sample
    rows = rows[:sample]
    target = TARGETS[part.name]
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        found.setdefault((kind_of(row), row[target]), []).append(row)
    groups = []
    for (kind, where), members in found.items():
        seen = [row[part.attempted_at_field] or row["created_at"] for row in members]
        newest = members[0]  # rows come newest first
        groups.append(
            FailureGroup(
                part=part.name,
                kind=kind,
                target=where,
                count=len(members),
                first_seen=min(seen),
                last_seen=max(seen),
                example=(newest["last_error"] or "")[:EXAMPLE_CHARS],
                example_id=newest["pk"],
            )
        )
    groups.sort(key=lambda g: (-g.count, -(g.last_seen.timestamp() if g.last_seen else 0)))
    return Failures(groups=tuple(groups), examined=len(rows), capped=capped)


@dataclass
class Selected:
    """The rows of a group found now, newest first."""

    ids: list[Any] = field(default_factory=list)
    #: Whether more of the group may exist beyond what was taken (the limits).
    more: bool = False


def select(part: Part, kind: str, target: str, *, limit: int | None = None) -> Selected:
    """The failed rows of *part* of this *kind* at *target*, newest first: at most
    *limit* (``ACTION_LIMIT``), found among at most ``SCAN_LIMIT`` failed rows of
    *target*, read ``operator.CHUNK`` at a time."""
    limit = ACTION_LIMIT if limit is None else limit
    chosen = Selected()
    rows = failed_rows(part).filter(**{TARGETS[part.name]: target})
    described = _described(part, rows).order_by("-pk")
    last = None
    read = 0
    while True:
        page = described if last is None else described.filter(pk__lt=last)
        chunk = list(page[: operator.CHUNK])
        for row in chunk:
            if kind_of(row) != kind:
                continue
            if len(chosen.ids) == limit:
                chosen.more = True
                return chosen
            chosen.ids.append(row["pk"])
        read += len(chunk)
        if len(chunk) < operator.CHUNK:
            return chosen
        if read >= SCAN_LIMIT:
            chosen.more = True
            return chosen
        last = chunk[-1]["pk"]


@dataclass(frozen=True)
class Acted:
    """What an action on a group did."""

    #: Rows of the group found (at most ``ACTION_LIMIT``).
    matched: int
    #: Of those, the rows the action moved (a row that changed meanwhile is left alone).
    moved: int
    #: Whether more rows of the group may be left (run the action again).
    more: bool


def act(
    part: Part, verb: operator.Verb, kind: str, target: str, *, limit: int | None = None
) -> Acted:
    """Apply *verb* (``engine.operator``) to the failed rows of *part* of this *kind* at
    *target*: at most *limit* (``ACTION_LIMIT``) rows, one transaction per
    ``operator.CHUNK``."""
    chosen = select(part, kind, target, limit=limit)
    moved = 0
    manager = part.model._default_manager.using(part.using)
    for start in range(0, len(chosen.ids), operator.CHUNK):
        ids = chosen.ids[start : start + operator.CHUNK]
        moved += operator.act(verb, manager.filter(pk__in=ids)).count
    return Acted(matched=len(chosen.ids), moved=moved, more=chosen.more)


def verbs(part: Part) -> list[operator.Verb]:
    """The actions an operator may take on *part*'s failed rows."""
    return operator.verbs_from(part.model, part.lifecycle.failed)


__all__ = [
    "ACTION_LIMIT",
    "FAILED_SAMPLE",
    "Acted",
    "FailureGroup",
    "Failures",
    "act",
    "error_kind",
    "failed_rows",
    "read",
    "select",
    "verbs",
]
