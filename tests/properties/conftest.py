"""Hypothesis profiles for the property tests of the state machines.

``ci`` (the default) keeps the directory under a minute per database: few examples,
short runs, derandomized so a failure in CI reproduces on a laptop. ``full`` is for a
long local run: ``HYPOTHESIS_PROFILE=full pytest -m properties tests/properties``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

SUPPRESSED = (HealthCheck.too_slow, HealthCheck.function_scoped_fixture)

settings.register_profile(
    "ci",
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=SUPPRESSED,
)
settings.register_profile(
    "full",
    max_examples=500,
    stateful_step_count=60,
    deadline=None,
    print_blob=True,
    suppress_health_check=SUPPRESSED,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
