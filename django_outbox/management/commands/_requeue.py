"""The shared shape of ``outbox_requeue``, ``inbox_requeue`` and ``jobs_requeue``:
select rows by filters (at least one), count them with ``--dry-run``, else move them
in batches through the part's own domain method."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, models

from django_outbox.management.commands._args import positive_int


class RequeueCommand(BaseCommand):
    #: The rows' model, the state they are requeued from and what they are called.
    model: type[models.Model]
    from_state: str
    noun = "message"
    #: The queryset method that moves a batch (returns how many moved).
    method = "requeue"
    past = "requeued"
    #: Option names (``dest``) of which at least one must be given.
    filters: tuple[str, ...] = ()

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)
        parser.add_argument(
            "--state",
            choices=[self.from_state],
            help=f"Only this state ({self.from_state} is the only state moved back).",
        )
        self.add_filters(parser)
        parser.add_argument("--dry-run", action="store_true", help="Count, change nothing.")
        parser.add_argument("--batch", type=positive_int, default=1000, help="Rows per UPDATE.")

    def add_filters(self, parser: CommandParser) -> None:
        """Add the part's own filter options."""

    def select(self, selection: models.QuerySet[Any], options: dict[str, Any]) -> Any:
        """Narrow *selection* by the part's own filter options."""
        return selection

    def handle(self, *args: Any, **options: Any) -> None:
        given = ("state", *self.filters)
        if not any(options[name] for name in given):
            flags = ", ".join("--" + name.rstrip("s").replace("_", "-") for name in given)
            raise CommandError(f"give at least one of {flags}")
        using = options["database"]
        manager = self.model._default_manager.using(using)
        selection = self.select(manager.filter(state=self.from_state), options)
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
            done += getattr(manager.filter(pk__in=pks), self.method)()
            if total > options["batch"]:
                self.stdout.write(f"{self.past} {done}/{total}")
        self.stdout.write(self.style.SUCCESS(f"{self.past} {done} {noun}"))
