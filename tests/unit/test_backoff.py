import random

import pytest

from django_outbox.engine import backoff_delay


def test_delay_doubles_per_attempt_within_equal_jitter_bounds():
    rng = random.Random(7)
    for attempts, ceiling in [(1, 2), (2, 4), (3, 8), (4, 16)]:
        for _ in range(50):
            delay = backoff_delay(attempts, base=2, maximum=3600, rng=rng)
            assert ceiling / 2 <= delay <= ceiling


def test_delay_is_capped_at_maximum_even_for_huge_attempt_counts():
    assert backoff_delay(10_000, base=2, maximum=60, rng=random.Random(1)) <= 60


def test_jitter_spreads_retries():
    rng = random.Random(3)
    delays = {round(backoff_delay(5, base=1, maximum=100, rng=rng), 6) for _ in range(20)}
    assert len(delays) > 10


@pytest.mark.parametrize("attempts", [0, -1])
def test_attempts_must_be_positive(attempts):
    with pytest.raises(ValueError, match="attempts"):
        backoff_delay(attempts, base=1, maximum=1)
