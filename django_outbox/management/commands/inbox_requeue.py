from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser
from django.db.models import Q

from django_outbox.inbox.models import InboxMessage, InboxState
from django_outbox.management.commands._requeue import RequeueCommand


class Command(RequeueCommand):
    help = (
        "Requeue inbox messages in handle_error (attempts reset) selected by state, type, "
        "source or ids, e.g. after deploying the fix of a failing handler or a handler for a "
        "type that had none. At least one filter is required."
    )
    model = InboxMessage
    from_state = InboxState.HANDLE_ERROR
    filters = ("types", "sources", "ids")

    def add_filters(self, parser: CommandParser) -> None:
        parser.add_argument("--type", dest="types", action="append", default=[])
        parser.add_argument("--source", dest="sources", action="append", default=[])
        parser.add_argument(
            "--id",
            dest="ids",
            action="append",
            default=[],
            help="Row id or the sender's message id; repeatable.",
        )

    def select(self, selection: Any, options: dict[str, Any]) -> Any:
        if options["types"]:
            selection = selection.filter(type__in=options["types"])
        if options["sources"]:
            selection = selection.filter(source__in=options["sources"])
        if options["ids"]:
            pks = [int(ref) for ref in options["ids"] if ref.isdigit()]
            selection = selection.filter(Q(pk__in=pks) | Q(message_id__in=options["ids"]))
        return selection
