from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser
from django.db import connections

from django_outbox.engine.runner import Runner
from django_outbox.jobs.running import Jobs
from django_outbox.management.commands._worker import WorkerCommand


class Command(WorkerCommand):
    help = (
        "Run background jobs in the foreground (without Celery, or beside it). Wakes on "
        "PostgreSQL NOTIFY where available, otherwise polls; stops cleanly on SIGTERM/SIGINT "
        "after the job in hand. While it runs it keeps a heartbeat: its jobs' leases are "
        "renewed however long they take, and if it dies they run again within seconds."
    )
    name = "jobs_worker"
    noun = "job"
    done_verb = "successful"
    batch_help = "Exit after this many batches that ran jobs (idle polls do not count)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            default=None,
            help="Run jobs of this queue (repeatable; default: every queue).",
        )
        super().add_arguments(parser)

    def runner(self, options: dict[str, Any]) -> Runner:
        return Jobs(
            using=options["database"], queues=options["queues"], batch_size=options["batch"]
        )

    def banner(self, runner: Runner, options: dict[str, Any]) -> str:
        connection = connections[runner.using]
        queues = ", ".join(options["queues"] or ["every queue"])
        return (
            f"jobs_worker: database {runner.using!r} ({connection.vendor}), "
            f"batch {runner.batch_size}, queues: {queues}"
        )
