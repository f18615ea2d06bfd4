from __future__ import annotations

from typing import Any

from django_outbox.inbox.maintenance import sweep
from django_outbox.management.commands._maintenance import SweepCommand


class Command(SweepCommand):
    help = (
        "One recovery pass of the inbox: give back the claims of dead workers, then handle "
        "what is due (lost triggers, retries that came due)."
    )

    def sweep(self, using: str, time_budget: float | None) -> dict[str, Any]:
        return sweep(using=using, time_budget=time_budget)
