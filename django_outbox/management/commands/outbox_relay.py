from __future__ import annotations

import json
import signal
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections

from django_outbox.engine.loop import WorkerLoop
from django_outbox.engine.runner import RunResult
from django_outbox.management.commands._args import non_negative_float, positive_int
from django_outbox.outbox.relay import Relay


class Command(BaseCommand):
    help = (
        "Run the outbox relay in the foreground (for projects without Celery). Wakes on "
        "PostgreSQL NOTIFY where available, otherwise polls; stops cleanly on SIGTERM/SIGINT. "
        "While it runs it keeps a heartbeat: if it dies, the messages it held are sent by "
        "another relay within seconds."
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
            help="Seconds between rescues of expired leases (default 10). Rows of a relay "
            "that died are rescued sooner, by the heartbeats of the live ones.",
        )
        parser.add_argument("--until-empty", action="store_true", help="Exit once nothing is due.")
        parser.add_argument(
            "--max-batches",
            type=positive_int,
            default=None,
            help="Exit after this many batches that carried messages (idle polls do not count).",
        )
        parser.add_argument("--no-listen", action="store_true", help="Poll; do not LISTEN.")
        parser.add_argument(
            "--json", action="store_true", help="Print the exit summary as one JSON object."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        relay = Relay(using=options["database"], batch_size=options["batch"])
        worker = WorkerLoop(
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
        if options["verbosity"] >= 1 and not options["json"]:
            self.stdout.write(self._banner(relay))
        started = time.monotonic()
        total = worker.run()
        if options["json"]:
            self.stdout.write(json.dumps(total.as_dict(), sort_keys=True))
        elif options["verbosity"] >= 1:
            elapsed = time.monotonic() - started
            self.stdout.write(
                f"outbox_relay stopped after {elapsed:.1f}s: {total.done} sent, "
                f"{total.retried} to retry, {total.failed} failed, in {total.batches} batch(es)"
                + (f"; {worker.errors} error(s), see the log" if worker.errors else "")
            )

    def _banner(self, relay: Relay) -> str:
        part = relay.part
        connection = connections[part.using]
        destinations = ", ".join(
            f"{name} ({d.transport})" for name, d in part.settings.outbox.destinations.items()
        )
        return (
            f"outbox_relay: database {part.using!r} ({connection.vendor}), "
            f"dispatch {part.settings.dispatch}, batch {relay.batch_size}, "
            f"destinations: {destinations or 'none configured'}"
        )

    def _report(self, result: RunResult) -> None:
        self.stdout.write(json.dumps(result.as_dict(), sort_keys=True))
