from __future__ import annotations

from typing import Any

from django_outbox.management.commands._maintenance import SweepCommand
from django_outbox.outbox.maintenance import sweep


class Command(SweepCommand):
    help = (
        "One recovery pass of the outbox: rescue messages whose lease expired or whose "
        "worker died, then deliver what is due."
    )

    def sweep(self, using: str, time_budget: float | None) -> dict[str, Any]:
        return sweep(using=using, time_budget=time_budget)
