from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS
from django.db.models import Q

from django_outbox.inbox.models import REQUEUEABLE_STATES, InboxMessage, InboxState
from django_outbox.management.commands._args import positive_int


class Command(BaseCommand):
    help = (
        "Requeue inbox messages in handle_error (attempts reset) selected by state, type, "
        "source or ids, e.g. after deploying the fix of a failing handler or a handler for a "
        "type that had none. At least one filter is required."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)
        parser.add_argument(
            "--state",
            choices=[s.value for s in REQUEUEABLE_STATES],
            help="Only this state (handle_error is the only requeueable state).",
        )
        parser.add_argument("--type", dest="types", action="append", default=[])
        parser.add_argument("--source", dest="sources", action="append", default=[])
        parser.add_argument(
            "--id",
            dest="ids",
            action="append",
            default=[],
            help="Row id or the sender's message id; repeatable.",
        )
        parser.add_argument("--dry-run", action="store_true", help="Count, change nothing.")
        parser.add_argument("--batch", type=positive_int, default=1000, help="Rows per UPDATE.")

    def handle(self, *args: Any, **options: Any) -> None:
        if not (options["state"] or options["types"] or options["sources"] or options["ids"]):
            raise CommandError("give at least one of --state, --type, --source, --id")
        using = options["database"]
        selection = InboxMessage.objects.using(using).filter(state=InboxState.HANDLE_ERROR)
        if options["types"]:
            selection = selection.filter(type__in=options["types"])
        if options["sources"]:
            selection = selection.filter(source__in=options["sources"])
        if options["ids"]:
            pks = [int(ref) for ref in options["ids"] if ref.isdigit()]
            selection = selection.filter(Q(pk__in=pks) | Q(message_id__in=options["ids"]))
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
            done += InboxMessage.objects.using(using).filter(pk__in=pks).requeue()
        self.stdout.write(f"{done} message(s) requeued")
