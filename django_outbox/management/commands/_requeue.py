"""The shared shape of ``outbox_requeue``, ``inbox_requeue`` and ``jobs_requeue``:
select rows by filters (at least one), count them with ``--dry-run``, else requeue (for
jobs: retry) them in batches through the engine's operator action
(``engine.operator.requeue``), each batch committed and its part's runners triggered."""

from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, models
from django.db.models import Q

from django_outbox.engine import operator
from django_outbox.management.commands._args import message_ref, positive_int


class RequeueCommand(BaseCommand):
    #: The rows' model, the state they are requeued from and what they are called.
    model: type[models.Model]
    from_state: str
    noun = "message"
    #: What the part calls a requeue, done (jobs: "retried").
    past = "requeued"
    #: Option names (``dest``) of which at least one must be given (``--id`` is one).
    filters: tuple[str, ...] = ()
    #: What ``--id`` matches besides the row id: the field, whether it holds UUIDs
    #: (else any text, as the inbox's sender ids), and the option's help.
    other_id = "message_id"
    uuid_ids = True
    id_help = "Row id or message UUID; repeatable."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)
        parser.add_argument(
            "--state",
            choices=[self.from_state],
            help=f"Only this state ({self.from_state} is the only state moved back).",
        )
        self.add_filters(parser)
        parser.add_argument(
            "--id",
            dest="ids",
            action="append",
            type=message_ref if self.uuid_ids else str,
            default=[],
            help=self.id_help,
        )
        parser.add_argument("--dry-run", action="store_true", help="Count, change nothing.")
        parser.add_argument("--batch", type=positive_int, default=1000, help="Rows per UPDATE.")

    def add_filters(self, parser: CommandParser) -> None:
        """Add the part's own filter options."""

    def select(self, selection: models.QuerySet[Any], options: dict[str, Any]) -> Any:
        """Narrow *selection* by the part's own filter options."""
        return selection

    def by_ids(self, selection: models.QuerySet[Any], refs: list[Any]) -> Any:
        """Narrow *selection* to the rows ``--id`` names (row ids or *other_id*)."""
        if self.uuid_ids:
            pks = [ref for ref in refs if isinstance(ref, int)]
            others = [ref for ref in refs if isinstance(ref, uuid.UUID)]
        else:
            pks = [int(ref) for ref in refs if ref.isdigit()]
            others = refs
        return selection.filter(Q(pk__in=pks) | Q(**{f"{self.other_id}__in": others}))

    def handle(self, *args: Any, **options: Any) -> None:
        given = ("state", *self.filters, "ids")
        if not any(options[name] for name in given):
            flags = ", ".join("--" + name.rstrip("s").replace("_", "-") for name in given)
            raise CommandError(f"give at least one of {flags}")
        using = options["database"]
        manager = self.model._default_manager.using(using)
        selection = self.select(manager.filter(state=self.from_state), options)
        if options["ids"]:
            selection = self.by_ids(selection, options["ids"])
        total = selection.count()
        noun = f"{self.noun}(s)"
        if options["dry_run"]:
            self.stdout.write(f"{total} {noun} would be {self.past} (dry run)")
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
            done += operator.requeue(manager.filter(pk__in=pks)).count
            if total > options["batch"]:
                self.stdout.write(f"{self.past} {done}/{total}")
        self.stdout.write(self.style.SUCCESS(f"{self.past} {done} {noun}"))
