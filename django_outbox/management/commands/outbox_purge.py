from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DEFAULT_DB_ALIAS

from django_outbox.management.commands._args import non_negative_float, positive_int
from django_outbox.outbox.maintenance import purge_finished_messages


class Command(BaseCommand):
    help = "Delete sent and cancelled outbox messages older than the retention period."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)
        parser.add_argument(
            "--older-than-days",
            type=non_negative_float,
            default=None,
            help="Retention in days (default: RETENTION_DAYS).",
        )
        parser.add_argument("--batch", type=positive_int, default=None, help="Rows per DELETE.")

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["older_than_days"]
        deleted = purge_finished_messages(
            using=options["database"],
            older_than=timedelta(days=days) if days is not None else None,
            batch_size=options["batch"],
        )
        self.stdout.write(f"purged {deleted} message(s)")
