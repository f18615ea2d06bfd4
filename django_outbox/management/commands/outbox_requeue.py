from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from django_outbox.management.commands._requeue import RequeueCommand
from django_outbox.outbox.models import OutboxMessage, OutboxState


class Command(RequeueCommand):
    help = (
        "Requeue outbox messages in send_error (attempts reset) selected by state, type, "
        "destination or ids. At least one filter is required."
    )
    model = OutboxMessage
    from_state = OutboxState.SEND_ERROR
    filters = ("types", "destinations", "uncertain")

    def add_filters(self, parser: CommandParser) -> None:
        parser.add_argument("--type", dest="types", action="append", default=[])
        parser.add_argument("--destination", dest="destinations", action="append", default=[])
        parser.add_argument("--uncertain", action="store_true", help="Only uncertain messages.")

    def select(self, selection: Any, options: dict[str, Any]) -> Any:
        if options["types"]:
            selection = selection.filter(type__in=options["types"])
        if options["destinations"]:
            selection = selection.filter(destination__in=options["destinations"])
        if options["uncertain"]:
            selection = selection.filter(uncertain=True)
        return selection
