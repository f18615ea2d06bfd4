from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from django_outbox.jobs.models import Job, JobState
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
    past = "retried"
    filters = ("tasks", "queues")
    other_id = "result_id"
    id_help = "Row id or result id (UUID); repeatable."

    def add_filters(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--task", dest="tasks", action="append", default=[], help="Dotted task path."
        )
        parser.add_argument("--queue", dest="queues", action="append", default=[])

    def select(self, selection: Any, options: dict[str, Any]) -> Any:
        if options["tasks"]:
            selection = selection.filter(task_path__in=options["tasks"])
        if options["queues"]:
            selection = selection.filter(queue_name__in=options["queues"])
        return selection
