"""The ``HEALTH`` section of ``DJANGO_OUTBOX``: defaults, validation, and the short-token
warning of the system checks."""

import pytest

from django_outbox.checks import check_settings
from django_outbox.conf import HealthSettings, load
from django_outbox.exceptions import ConfigurationError


def test_the_defaults():
    assert load({}).health == HealthSettings(
        token="",
        oldest_due_warning_seconds=60.0,
        oldest_due_critical_seconds=600.0,
        dead_lettered_minutes=15,
        dead_lettered_warning=1,
        dead_lettered_critical=100,
        no_worker_seconds=30.0,
        sweep_late_critical_seconds=600.0,
    )


def test_values_are_read():
    health = load(
        {"HEALTH": {"TOKEN": "t" * 40, "OLDEST_DUE_WARNING_SECONDS": 5, "NO_WORKER_SECONDS": 0}}
    ).health
    assert (health.token, health.oldest_due_warning_seconds, health.no_worker_seconds) == (
        "t" * 40,
        5.0,
        0.0,
    )


@pytest.mark.parametrize(
    ("health", "message"),
    [
        ([], r"\['HEALTH'\] must be a dict"),
        ({"TOKN": "x"}, "unknown key 'TOKN' \\(did you mean 'TOKEN'\\?\\)"),
        ({"TOKEN": 123}, r"\['TOKEN'\] must be a string"),
        ({"DEAD_LETTERED_MINUTES": 1.5}, "must be an integer"),
        ({"DEAD_LETTERED_MINUTES": 121}, "must be <= 120"),
        ({"DEAD_LETTERED_WARNING": 0}, "must be >= 1"),
        ({"OLDEST_DUE_WARNING_SECONDS": -1}, "must be >= 0"),
        (
            {"OLDEST_DUE_WARNING_SECONDS": 700},
            r"OLDEST_DUE_CRITICAL_SECONDS'\] \(600\) must be at least OLDEST_DUE_WARNING",
        ),
        (
            {"DEAD_LETTERED_WARNING": 5, "DEAD_LETTERED_CRITICAL": 4},
            "must be at least DEAD_LETTERED_WARNING",
        ),
        ({"SWEEP_LATE_CRITICAL_SECONDS": 30}, "must be at least SWEEP_STALE_SECONDS"),
    ],
)
def test_bad_values_are_refused_with_their_path(health, message):
    with pytest.raises(ConfigurationError, match=message):
        load({"HEALTH": health})


@pytest.mark.parametrize(("token", "warned"), [("", False), ("short", True), ("x" * 32, False)])
def test_a_short_token_is_reported(settings, token, warned):
    settings.DJANGO_OUTBOX = {**settings.DJANGO_OUTBOX, "HEALTH": {"TOKEN": token}}
    ids = [message.id for message in check_settings()]
    assert ("django_outbox.W021" in ids) is warned
