"""The shared shape of the sweep and purge commands of the three parts: the options,
the output, and the part's own maintenance function behind them."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DEFAULT_DB_ALIAS

from django_outbox.management.commands._args import non_negative_float, positive_int


class SweepCommand(BaseCommand):
    """One recovery pass of a part (what Celery beat's sweep task of the part does)."""

    #: Whether the sweep drains what is due itself (and takes ``--time-budget``).
    drains = True

    def sweep(self, using: str, time_budget: float | None) -> dict[str, Any]:
        raise NotImplementedError

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)
        if self.drains:
            parser.add_argument(
                "--time-budget",
                type=non_negative_float,
                default=None,
                help="Seconds to spend draining (default: DRAIN_SECONDS).",
            )

    def handle(self, *args: Any, **options: Any) -> None:
        counts = self.sweep(options["database"], options.get("time_budget"))
        self.stdout.write(json.dumps(counts, sort_keys=True, default=str))


class PurgeCommand(BaseCommand):
    """Delete a part's finished rows past the retention period, in batches."""

    noun = "row"
    purge: Callable[..., int]

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)
        parser.add_argument(
            "--older-than-days",
            type=non_negative_float,
            default=None,
            help="Retention in days (default: the part's RETENTION_DAYS).",
        )
        parser.add_argument("--batch", type=positive_int, default=None, help="Rows per DELETE.")

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["older_than_days"]
        deleted = type(self).purge(
            using=options["database"],
            older_than=timedelta(days=days) if days is not None else None,
            batch_size=options["batch"],
        )
        self.stdout.write(f"purged {deleted} {self.noun}(s)")
