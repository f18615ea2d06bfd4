"""Exponential backoff with jitter (pure: no I/O, no clock)."""

from __future__ import annotations

import random

# 2**62 seconds is far beyond any sane maximum; capping the exponent keeps the
# arithmetic in floats that cannot overflow however many attempts are made.
_MAX_EXPONENT = 62


def backoff_delay(
    attempts: int, *, base: float, maximum: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait after the *attempts*-th failed attempt.

    The ceiling doubles per attempt (``base``, ``2*base``, ``4*base`` …) up to
    ``maximum``; the delay is drawn uniformly from the upper half of the
    ceiling ("equal jitter"), so retries spread out but never come early.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    if base < 0 or maximum < 0:
        raise ValueError("base and maximum must be >= 0")
    ceiling = min(maximum, base * 2.0 ** min(attempts - 1, _MAX_EXPONENT))
    draw = (rng or random).random()
    return ceiling / 2 + draw * ceiling / 2
