from __future__ import annotations

from typing import Any

from django_outbox.jobs.maintenance import sweep
from django_outbox.management.commands._maintenance import SweepCommand


class Command(SweepCommand):
    help = (
        "One recovery pass of the jobs: rescue jobs whose lease expired or whose worker "
        "died, wake every queue with due jobs, complete batches whose last finisher died."
    )
    drains = False

    def sweep(self, using: str, time_budget: float | None) -> dict[str, Any]:
        return sweep(using=using)
