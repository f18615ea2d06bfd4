"""``outbox_partition``: turn the parts' tables into time-partitioned tables
(PostgreSQL), show their partitions, and make the coming ones."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections, models

from django_outbox.conf import get_settings
from django_outbox.engine import partitions
from django_outbox.inbox.models import InboxMessage, InboxSeen
from django_outbox.jobs.models import Job
from django_outbox.management.commands._args import positive_int
from django_outbox.outbox.models import OutboxMessage

PARTS: dict[str, type[models.Model]] = {"outbox": OutboxMessage, "inbox": InboxMessage, "jobs": Job}


class Command(BaseCommand):
    help = (
        "Partition the outbox, inbox or jobs table by creation time (PostgreSQL): "
        "'convert' once, then the purge drops whole partitions past RETENTION_DAYS and "
        "creates PARTITIONS_AHEAD coming ones. 'status' lists the partitions; 'ahead' "
        "creates the coming ones now."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=("convert", "status", "ahead"))
        parser.add_argument(
            "parts", nargs="*", choices=[*PARTS, []], help="outbox, inbox, jobs (default: all)"
        )
        parser.add_argument(
            "--interval",
            choices=partitions.INTERVALS,
            default="day",
            help="One partition per day (default), week or month (convert).",
        )
        parser.add_argument(
            "--ahead",
            type=positive_int,
            default=None,
            help="Partitions to make after the current one (default: PARTITIONS_AHEAD).",
        )
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"]
        if connections[using].vendor != "postgresql":
            raise CommandError("partitioned tables need PostgreSQL")
        names = options["parts"] or list(PARTS)
        for name in names:
            model = PARTS[name]
            ahead = options["ahead"] or _ahead(name)
            if options["action"] == "convert":
                self._convert(name, model, using, options["interval"], ahead)
            elif options["action"] == "ahead":
                made = partitions.create_ahead(model, using, ahead)
                if not partitions.is_partitioned(model, using):
                    self.stdout.write(f"{name}: not partitioned")
                else:
                    self.stdout.write(f"{name}: created {len(made)} partition(s) {' '.join(made)}")
            else:
                self._status(name, model, using)

    def _convert(
        self, name: str, model: type[models.Model], using: str, interval: str, ahead: int
    ) -> None:
        partitions.forget()
        if partitions.is_partitioned(model, using):
            self.stdout.write(f"{name}: partitioned already")
            return
        try:
            done = partitions.convert(
                model,
                using,
                interval,
                ahead=ahead,
                seen_model=InboxSeen if model is InboxMessage else None,
                say=lambda line: self.stdout.write(line),
            )
        except partitions.PartitioningError as exc:
            raise CommandError(f"{name}: {exc}") from exc
        seen = f", {done.seen} message id(s) remembered" if model is InboxMessage else ""
        self.stdout.write(
            self.style.SUCCESS(
                f"{name}: {done.table} is partitioned by {done.interval}; its {done.rows} "
                f"row(s) stay in {done.table}_legacy (everything before "
                f"{done.cutover:%Y-%m-%d %H:%M} UTC){seen}; created {len(done.created)} "
                "partition(s) and the default one"
            )
        )

    def _status(self, name: str, model: type[models.Model], using: str) -> None:
        shape = partitions.layout(model, using)
        if shape is None:
            self.stdout.write(f"{name}: {model._meta.db_table} is not partitioned")
            return
        found = partitions.partitions(model, using)
        self.stdout.write(
            f"{name}: {shape.table} partitioned by {shape.interval} of {shape.column}"
        )
        for partition in found:
            if partition.default:
                span = "DEFAULT"
            else:
                lower = f"{partition.lower:%Y-%m-%d %H:%M}" if partition.lower else "MINVALUE"
                span = f"{lower} .. {partition.upper:%Y-%m-%d %H:%M}"
            self.stdout.write(f"  {partition.name}: {span}")


def _ahead(name: str) -> int:
    return get_settings().engine(name).partitions_ahead
