from __future__ import annotations

import json
import signal
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections

from django_outbox.engine.loop import WorkerLoop
from django_outbox.engine.runner import RunResult
from django_outbox.jobs.running import Jobs
from django_outbox.management.commands._args import non_negative_float, positive_int


class Command(BaseCommand):
    help = (
        "Run background jobs in the foreground (without Celery, or beside it). Wakes on "
        "PostgreSQL NOTIFY where available, otherwise polls; stops cleanly on SIGTERM/SIGINT "
        "after the job in hand. While it runs it keeps a heartbeat: its jobs' leases are "
        "renewed however long they take, and if it dies they run again within seconds."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            default=None,
            help="Run jobs of this queue (repeatable; default: every queue).",
        )
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)
        parser.add_argument("--batch", type=positive_int, default=None, help="Jobs per claim.")
        parser.add_argument(
            "--interval",
            type=non_negative_float,
            default=1.0,
            help="Seconds to wait between polls when idle (default 1).",
        )
        parser.add_argument(
            "--sweep-interval",
            type=non_negative_float,
            default=10.0,
            help="Seconds between rescues of expired leases (default 10).",
        )
        parser.add_argument("--until-empty", action="store_true", help="Exit once nothing is due.")
        parser.add_argument(
            "--max-batches",
            type=positive_int,
            default=None,
            help="Exit after this many batches that ran jobs (idle polls do not count).",
        )
        parser.add_argument("--no-listen", action="store_true", help="Poll; do not LISTEN.")
        parser.add_argument(
            "--json", action="store_true", help="Print the exit summary as one JSON object."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        jobs = Jobs(
            using=options["database"], queues=options["queues"], batch_size=options["batch"]
        )
        worker = WorkerLoop(
            jobs,
            interval=options["interval"],
            sweep_interval=options["sweep_interval"],
            until_empty=options["until_empty"],
            max_batches=options["max_batches"],
            listen=not options["no_listen"],
            report=self._report if options["verbosity"] >= 2 else None,
        )
        signal.signal(signal.SIGTERM, worker.stop)
        signal.signal(signal.SIGINT, worker.stop)
        if options["verbosity"] >= 1 and not options["json"]:
            connection = connections[jobs.using]
            queues = ", ".join(options["queues"] or ["every queue"])
            self.stdout.write(
                f"jobs_worker: database {jobs.using!r} ({connection.vendor}), "
                f"batch {jobs.batch_size}, queues: {queues}"
            )
        started = time.monotonic()
        total = worker.run()
        if options["json"]:
            self.stdout.write(json.dumps(total.as_dict(), sort_keys=True))
        elif options["verbosity"] >= 1:
            elapsed = time.monotonic() - started
            self.stdout.write(
                f"jobs_worker stopped after {elapsed:.1f}s: {total.done} successful, "
                f"{total.retried} to retry, {total.failed} failed, in {total.batches} batch(es)"
                + (f"; {worker.errors} error(s), see the log" if worker.errors else "")
            )

    def _report(self, result: RunResult) -> None:
        self.stdout.write(json.dumps(result.as_dict(), sort_keys=True))
