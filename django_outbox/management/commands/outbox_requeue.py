from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS
from django.db.models import Q

from django_outbox.management.commands._args import message_ref, positive_int
from django_outbox.outbox.models import REQUEUEABLE_STATES, OutboxMessage, OutboxState


class Command(BaseCommand):
    help = (
        "Requeue outbox messages in send_error (attempts reset) selected by state, type, "
        "destination or ids. At least one filter is required."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)
        parser.add_argument(
            "--state",
            choices=[s.value for s in REQUEUEABLE_STATES],
            help="Only this state (send_error is the only requeueable state).",
        )
        parser.add_argument("--type", dest="types", action="append", default=[])
        parser.add_argument("--destination", dest="destinations", action="append", default=[])
        parser.add_argument(
            "--id",
            dest="ids",
            action="append",
            type=message_ref,
            default=[],
            help="Row id or message UUID; repeatable.",
        )
        parser.add_argument("--uncertain", action="store_true", help="Only uncertain messages.")
        parser.add_argument("--dry-run", action="store_true", help="Count, change nothing.")
        parser.add_argument("--batch", type=positive_int, default=1000, help="Rows per UPDATE.")

    def handle(self, *args: Any, **options: Any) -> None:
        if not (
            options["state"]
            or options["types"]
            or options["destinations"]
            or options["ids"]
            or options["uncertain"]
        ):
            raise CommandError(
                "give at least one of --state, --type, --destination, --id, --uncertain"
            )
        selection = OutboxMessage.objects.using(options["database"]).filter(
            state=OutboxState.SEND_ERROR
        )
        if options["types"]:
            selection = selection.filter(type__in=options["types"])
        if options["destinations"]:
            selection = selection.filter(destination__in=options["destinations"])
        if options["uncertain"]:
            selection = selection.filter(uncertain=True)
        if options["ids"]:
            pks = [r for r in options["ids"] if isinstance(r, int)]
            uuids = [r for r in options["ids"] if isinstance(r, uuid.UUID)]
            selection = selection.filter(Q(pk__in=pks) | Q(message_id__in=uuids))
        total = selection.count()
        if options["dry_run"]:
            self.stdout.write(f"{total} message(s) would be requeued (dry run)")
            return
        done = 0
        last_pk = 0
        while True:
            pks = list(
                selection.filter(pk__gt=last_pk)
                .order_by("pk")
                .values_list("pk", flat=True)[: options["batch"]]
            )
            if not pks:
                break
            last_pk = pks[-1]
            done += OutboxMessage.objects.using(options["database"]).filter(pk__in=pks).requeue()
            if total > options["batch"]:
                self.stdout.write(f"requeued {done}/{total}")
        self.stdout.write(self.style.SUCCESS(f"requeued {done} message(s)"))
