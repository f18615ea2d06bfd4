from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import CommandParser
from django.db.models import Q

from django_outbox.jobs.models import Job, JobState
from django_outbox.management.commands._args import message_ref
from django_outbox.management.commands._requeue import RequeueCommand


class Command(RequeueCommand):
    help = (
        "Run FAILED jobs again (READY, attempts reset, their errors kept) selected by task, "
        "queue or ids, e.g. after deploying a fix. At least one filter is required. A job "
        "whose unique key is held by another READY or RUNNING job stays FAILED."
    )
    model = Job
    from_state = JobState.FAILED
    noun = "job"
    method = "retry"
    past = "retried"
    filters = ("tasks", "queues", "ids")

    def add_filters(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--task", dest="tasks", action="append", default=[], help="Dotted task path."
        )
        parser.add_argument("--queue", dest="queues", action="append", default=[])
        parser.add_argument(
            "--id",
            dest="ids",
            action="append",
            type=message_ref,
            default=[],
            help="Row id or result id (UUID); repeatable.",
        )

    def select(self, selection: Any, options: dict[str, Any]) -> Any:
        if options["tasks"]:
            selection = selection.filter(task_path__in=options["tasks"])
        if options["queues"]:
            selection = selection.filter(queue_name__in=options["queues"])
        if options["ids"]:
            pks = [r for r in options["ids"] if isinstance(r, int)]
            uuids = [r for r in options["ids"] if isinstance(r, uuid.UUID)]
            selection = selection.filter(Q(pk__in=pks) | Q(result_id__in=uuids))
        return selection
