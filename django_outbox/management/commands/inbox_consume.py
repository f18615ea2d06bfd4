"""``manage.py inbox_consume``: one thread per kombu source; the process lives exactly as
long as every source can consume.

Exit status: 0 when stopped (SIGTERM, SIGINT, ``--until-idle``); 1 when a source
cannot go on (its broker unreachable for ``--max-outage`` seconds, a refusal
reconnecting cannot fix, an unexpected error), after the other sources have
finished their batches in hand, so that a supervisor restarts it.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS

from django_outbox.conf import get_settings
from django_outbox.inbox.consumers.kombu import ConsumeResult, KombuConsumer
from django_outbox.inbox.consumers.outage import SourceUnavailable
from django_outbox.management.commands._args import non_negative_float, positive_int

logger = logging.getLogger("django_outbox.inbox")

#: Seconds the other sources get to finish their batches once one source failed.
STOP_GRACE_SECONDS = 30.0


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
        parser.add_argument(
            "--max-outage",
            type=non_negative_float,
            default=300.0,
            help="Seconds a source keeps trying to reach its broker before the command "
            "gives up and exits with status 1 (default 300; 0: at the first failure; "
            "'inf': never).",
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
                    max_outage=options["max_outage"],
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
        failures: list[tuple[KombuConsumer, BaseException]] = []

        def consume(consumer: KombuConsumer) -> None:
            try:
                consumer.run(until_idle=options["until_idle"])
            except BaseException as exc:
                # One source down stops them all: the process must not live on
                # without it, silently.
                failures.append((consumer, exc))
                stop()

        threads = [
            threading.Thread(
                target=consume,
                args=(consumer,),
                name=f"inbox_consume {consumer.source.name}",
                daemon=True,
            )
            for consumer in consumers
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            # A join with a timeout lets the signal handlers run meanwhile.
            while thread.is_alive() and not failures:
                thread.join(0.5)
        if failures:
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            raise CommandError(self._failure(*failures[0]))
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

    def _failure(self, consumer: KombuConsumer, exc: BaseException) -> str:
        """The one line the command ends with when *consumer* failed."""
        if isinstance(exc, SourceUnavailable):
            return str(exc)
        # Not the broker's doing (a bug, the database refusing everything): the
        # traceback is needed to fix it.
        logger.error("inbox source %r stopped", consumer.source.name, exc_info=exc)
        return f"inbox source {consumer.source.name!r} stopped: {type(exc).__name__}: {exc}"
