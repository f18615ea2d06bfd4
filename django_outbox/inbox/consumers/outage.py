"""When a consumer's broker goes away: how long to wait between tries, when to give up,
and what to say about it.

One outage is one episode: from the first failed try to the next connection
that works. It is logged twice, a WARNING when it begins and an INFO when
it ends (never once per try), and it ends the consumer with
``SourceUnavailable`` once it has lasted ``max_seconds``: a process that
cannot consume must exit, so that its supervisor restarts it and someone
sees it, rather than live on without consuming. Pure: no I/O, the caller
passes the clock.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from django_outbox.engine.backoff import backoff_delay

#: First pause after a failed try, and the longest one (seconds; equal jitter).
FIRST_PAUSE = 0.5
LONGEST_PAUSE = 15.0


class SourceUnavailable(Exception):
    """A consumer cannot go on: its broker stayed unreachable for longer than its
    ``max_outage``, or refused it for a reason reconnecting cannot fix (wrong password,
    a queue declared with other arguments). The text names the source and the URL."""


@dataclass
class Outage:
    """One episode of a broker being unreachable, started at *began* (monotonic)."""

    began: float
    #: Give up once the broker has been unreachable this long (seconds).
    max_seconds: float
    failures: int = 0
    rng: random.Random | None = None

    def next_pause(self, now: float) -> float | None:
        """Count a failed try made at *now*; return the seconds to wait before the next
        one, or ``None`` when the time allowed is spent. The last pause ends exactly at
        the deadline, so a broker back just in time is still found."""
        self.failures += 1
        remaining = self.began + self.max_seconds - now
        if remaining <= 0:
            return None
        pause = backoff_delay(self.failures, base=FIRST_PAUSE, maximum=LONGEST_PAUSE, rng=self.rng)
        return min(pause, remaining)

    def lasted(self, now: float) -> float:
        """Seconds since the outage began."""
        return now - self.began
