from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

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
    filters = ("types", "sources")
    uuid_ids = False
    id_help = "Row id or the sender's message id; repeatable."

    def add_filters(self, parser: CommandParser) -> None:
        parser.add_argument("--type", dest="types", action="append", default=[])
        parser.add_argument("--source", dest="sources", action="append", default=[])

    def select(self, selection: Any, options: dict[str, Any]) -> Any:
        if options["types"]:
            selection = selection.filter(type__in=options["types"])
        if options["sources"]:
            selection = selection.filter(source__in=options["sources"])
        return selection
