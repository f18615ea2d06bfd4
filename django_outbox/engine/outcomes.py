"""What a step says happened to each row: the engine's vocabulary of outcomes.

A part's ``process`` yields ``{primary key: outcome}``; the engine turns each
outcome into a named transition (``engine.transitions``) and records it. The
names are the engine's, not a delivery's: a job that raised, a handler that
failed and a publish the broker refused are all a ``Retry`` or a ``Fail``.

- ``Done``: the step succeeded (with a value of the part's, a job's result).
- ``Retry``: it failed and may succeed later: backoff, or dead-letter once the
  row's attempts are used up.
- ``Fail``: it failed for good: dead-letter now.
- ``Uncertain``: it may or may not have happened (a publish without an answer,
  a worker that died during the step): resent like a ``Retry``, or held for an
  operator where the part's policy says so.
- ``Skip``: deliberately not done (an inbox message older than what its key
  already handled).
- ``Defer``: not yet (a message waiting for a gap in its key): due again later,
  and the attempt is not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django_outbox.exceptions import RetryableError, UncertainError


@dataclass(frozen=True, slots=True)
class Done:
    """The step succeeded; *value* is recorded by the part (a job's return value)."""

    value: Any = None


#: The common ``Done`` (no value of its own).
DONE = Done()


@dataclass(frozen=True, slots=True)
class Retry:
    """A failure worth another attempt, after *delay* seconds (``None``: the part's
    backoff with jitter); dead-lettered once the row's attempts are used up.
    *details* are the part's own record of the failure (a traceback, say)."""

    error: str
    details: Mapping[str, Any] | None = None
    delay: float | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """A failure no retry can fix: dead-lettered now."""

    error: str
    details: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Uncertain:
    """The step may or may not have happened: resent like a ``Retry`` (after *delay*
    seconds, ``None``: the backoff), or held for an operator where the part holds
    uncertain rows (an outbox destination with ``UNCERTAIN: "hold"``)."""

    error: str
    details: Mapping[str, Any] | None = None
    delay: float | None = None


@dataclass(frozen=True, slots=True)
class Skip:
    """Deliberately not done: the row ends in the part's ``skipped`` state."""

    reason: str


@dataclass(frozen=True, slots=True)
class Defer:
    """Not yet: due again after *seconds*; the attempt is not counted. ``None``: due
    again at once, keeping when it became due (an outbox message waiting for its
    destination's circuit: its wait stays visible as the backlog's age)."""

    seconds: float | None
    reason: str


Outcome = Done | Retry | Fail | Uncertain | Skip | Defer
#: Outcomes of one group of rows, by primary key.
Outcomes = dict[Any, Outcome]
#: The outcomes that count as a failed attempt.
FAILURES = (Retry, Fail, Uncertain)


class _Waiting(dict[Any, Outcome]):
    """The type of ``WAITING``: outcomes of no row, told apart by identity."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "WAITING"


#: Yielded by a step that has handed its started rows over and now waits for the
#: answers (a broker's publisher confirms): the engine may run the next batch
#: meanwhile, and resumes the step afterwards. It names no row; a runner that does not
#: overlap batches simply goes on.
WAITING: Outcomes = _Waiting()


def describe(exc: BaseException) -> str:
    """``"ValueError: text"``, or the class name alone when the exception has no text."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def from_error(exc: BaseException | None, *, details: Mapping[str, Any] | None = None) -> Outcome:
    """The outcome a transport's answer stands for: ``None`` is ``DONE``; an
    ``UncertainError`` is ``Uncertain``, a ``RetryableError`` a ``Retry``, any other
    error a ``Fail``. The error's own text is kept as it is."""
    if exc is None:
        return DONE
    text = str(exc) or type(exc).__name__
    if isinstance(exc, UncertainError):
        return Uncertain(text, details)
    if isinstance(exc, RetryableError):
        return Retry(text, details)
    return Fail(text, details)


__all__ = [
    "DONE",
    "FAILURES",
    "Defer",
    "Done",
    "Fail",
    "Outcome",
    "Outcomes",
    "Retry",
    "Skip",
    "Uncertain",
    "describe",
    "from_error",
]
