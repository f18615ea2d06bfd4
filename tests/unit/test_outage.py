"""The retry budget of a consumer's outage (pure logic: the clock is passed in), and how
often it checks the broker's heartbeats."""

import random

import pytest

from django_outbox.inbox.consumers.kombu import heartbeat_tick_seconds
from django_outbox.inbox.consumers.outage import LONGEST_PAUSE, Outage


def test_pauses_grow_with_jitter_up_to_the_longest():
    outage = Outage(began=0.0, max_seconds=10_000, rng=random.Random(7))
    pauses = [outage.next_pause(0.0) for _ in range(12)]
    assert 0.25 <= pauses[0] <= 0.5
    assert 0.5 <= pauses[1] <= 1.0
    assert all(LONGEST_PAUSE / 2 <= p <= LONGEST_PAUSE for p in pauses[6:])
    assert outage.failures == 12


def test_the_last_pause_ends_at_the_deadline_then_it_gives_up():
    outage = Outage(began=100.0, max_seconds=5.0, rng=random.Random(1))
    assert outage.next_pause(104.9) == pytest.approx(0.1)
    assert outage.next_pause(105.0) is None
    assert outage.lasted(105.0) == 5.0


def test_no_budget_gives_up_at_the_first_failure():
    assert Outage(began=0.0, max_seconds=0.0).next_pause(0.0) is None


def test_an_infinite_budget_never_gives_up():
    outage = Outage(began=0.0, max_seconds=float("inf"))
    assert outage.next_pause(10.0**9) is not None


@pytest.mark.parametrize(
    ("heartbeat", "every"), [(60.0, 1.0), (10.0, 1.0), (2.0, 0.5), (1.0, 0.25), (0.0, 1.0)]
)
def test_the_consumer_checks_heartbeats_once_a_second_or_four_times_an_interval(heartbeat, every):
    """The broker's silence is noticed within a quarter of an interval of its deadline,
    and the check is not paid on every message."""
    assert heartbeat_tick_seconds(heartbeat) == every
