from __future__ import annotations

import json
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS

from django_outbox.conf import get_settings
from django_outbox.engine import heartbeat
from django_outbox.inbox.consumers.kombu import ConsumeResult, KombuConsumer
from django_outbox.management.commands._args import non_negative_float, positive_int


class Command(BaseCommand):
    help = (
        "Consume the inbox's kombu sources (RabbitMQ, Redis queues): store each message in "
        "the inbox, acknowledge it once stored, then handle it. Stops cleanly on "
        "SIGTERM/SIGINT, finishing the batch in hand."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "sources", nargs="*", help="Source names (default: every kombu source)."
        )
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)
        parser.add_argument(
            "--batch", type=positive_int, default=500, help="Messages per transaction."
        )
        parser.add_argument(
            "--batch-seconds",
            type=non_negative_float,
            default=0.05,
            help="Store what arrived within this time even if the batch is not full.",
        )
        parser.add_argument(
            "--no-handle",
            action="store_true",
            help="Only store and acknowledge; handling is left to the DISPATCH triggers.",
        )
        parser.add_argument(
            "--until-idle",
            type=non_negative_float,
            default=None,
            help="Exit once no message came for this many seconds.",
        )
        parser.add_argument("--json", action="store_true", help="Print the summary as JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        inbox = get_settings().inbox
        names = options["sources"] or [
            name for name, source in inbox.sources.items() if source.transport == "kombu"
        ]
        if not names:
            raise CommandError(
                "no kombu source to consume: add one to DJANGO_OUTBOX['INBOX']['SOURCES'], "
                "e.g. {'orders': {'TRANSPORT': 'kombu', 'URL': 'amqp://…', 'QUEUE': 'orders'}}"
            )
        consumers = []
        for name in names:
            try:
                source = inbox.source(name)
            except Exception as exc:
                raise CommandError(str(exc)) from None
            if source.transport != "kombu":
                raise CommandError(f"source {name!r} is a {source.transport} source, not kombu")
            consumers.append(
                KombuConsumer(
                    source,
                    using=options["database"],
                    batch_size=options["batch"],
                    batch_seconds=options["batch_seconds"],
                    handle=not options["no_handle"],
                )
            )

        def stop(*_: Any) -> None:
            for consumer in consumers:
                consumer.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        if options["verbosity"] >= 1 and not options["json"]:
            self.stdout.write(
                f"inbox_consume: {', '.join(names)}; "
                + ("storing and handling" if not options["no_handle"] else "storing only")
            )
        # The handlers' claims carry this process's worker id: if it dies, another
        # worker's heartbeat gives them back within seconds, not after their lease.
        heartbeat.start("inbox", options["database"])
        try:
            threads = [
                threading.Thread(
                    target=consumer.run, kwargs={"until_idle": options["until_idle"]}, daemon=True
                )
                for consumer in consumers[1:]
            ]
            for thread in threads:
                thread.start()
            consumers[0].run(until_idle=options["until_idle"])
            for thread in threads:
                thread.join()
        finally:
            heartbeat.stop()
        total = ConsumeResult()
        for consumer in consumers:
            for name, value in consumer.result.as_dict().items():
                setattr(total, name, getattr(total, name) + value)
        if options["json"]:
            self.stdout.write(json.dumps(total.as_dict(), sort_keys=True))
        elif options["verbosity"] >= 1:
            self.stdout.write(
                f"inbox_consume stopped: {total.received} received, {total.stored} stored, "
                f"{total.duplicates} duplicate(s), {total.unreadable} unreadable, "
                f"{total.handled} handled"
            )
