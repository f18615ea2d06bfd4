from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DEFAULT_DB_ALIAS

from django_outbox.management.commands._args import non_negative_float
from django_outbox.outbox.maintenance import sweep


class Command(BaseCommand):
    help = "One recovery pass: rescue messages whose lease expired, then deliver what is due."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)
        parser.add_argument(
            "--time-budget",
            type=non_negative_float,
            default=None,
            help="Seconds to spend draining (default: DRAIN_SECONDS).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        counts = sweep(using=options["database"], time_budget=options["time_budget"])
        self.stdout.write(json.dumps(counts, sort_keys=True))
