from __future__ import annotations

import json
import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DEFAULT_DB_ALIAS

from django_outbox.management.commands._args import non_negative_float, positive_int
from django_outbox.outbox.relay import Relay, RelayResult
from django_outbox.outbox.worker import RelayWorker


class Command(BaseCommand):
    help = (
        "Run the outbox relay in the foreground (for projects without Celery). Wakes on "
        "PostgreSQL NOTIFY where available, otherwise polls; stops cleanly on SIGTERM/SIGINT."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)
        parser.add_argument("--batch", type=positive_int, default=None, help="Rows per claim.")
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
            help="Exit after this many batches that carried messages (idle polls do not count).",
        )
        parser.add_argument("--no-listen", action="store_true", help="Poll; do not LISTEN.")

    def handle(self, *args: Any, **options: Any) -> None:
        relay = Relay(using=options["database"], batch_size=options["batch"])
        worker = RelayWorker(
            relay,
            interval=options["interval"],
            sweep_interval=options["sweep_interval"],
            until_empty=options["until_empty"],
            max_batches=options["max_batches"],
            listen=not options["no_listen"],
            report=self._report if options["verbosity"] >= 2 else None,
        )
        signal.signal(signal.SIGTERM, worker.stop)
        signal.signal(signal.SIGINT, worker.stop)
        total = worker.run()
        self.stdout.write(json.dumps(total.as_dict(), sort_keys=True))

    def _report(self, result: RelayResult) -> None:
        self.stdout.write(json.dumps(result.as_dict(), sort_keys=True))
