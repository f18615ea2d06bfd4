"""The job the jobs' state machine runs: it does what the test's script says."""

from __future__ import annotations

from django_outbox.jobs.compat import task
from testproject.shop.models import Payment

#: What the next run of each tag does: "ok", "retry" or "fail" (default "ok").
script: dict[str, str] = {}


@task(max_attempts=2, dont_retry=(ValueError,), retry_base_seconds=1, retry_max_seconds=5)
def scripted(tag: str) -> str:
    outcome = script.get(tag, "ok")
    if outcome == "retry":
        raise RuntimeError("scripted: try again")
    if outcome == "fail":
        raise ValueError("scripted: wrong for good")
    Payment.objects.create(order_ref=tag, status="job")
    return tag
