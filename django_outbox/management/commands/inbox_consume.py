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
from collections.abc import Mapping
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS

from django_outbox.conf import Source, get_settings
from django_outbox.engine import heartbeat
from django_outbox.engine.loop import WorkerLoop, settle_heap
from django_outbox.inbox.consumers.kombu import ConsumeResult, KombuConsumer
from django_outbox.inbox.consumers.outage import SourceUnavailable
from django_outbox.inbox.consumers.redis import RedisConsumer
from django_outbox.inbox.handling import Inbox
from django_outbox.management.commands._args import non_negative_float, positive_int
from django_outbox.management.commands._worker import add_metrics_port, serve_metrics
from django_outbox.outbox.transports.local import local_sources

#: How messages of the sources this command does not consume arrive.
_ARRIVAL = {
    "local": "its messages need no consumer: the relay's local transport stores them, and "
    "the DISPATCH triggers, the sweep or a running inbox_consume handle them",
    "webhook": "its messages arrive through the webhook view (inbox/{name}/)",
    "celery": "its messages arrive through the Celery task django_outbox.receive",
}


def _listing(
    sources: Mapping[str, Source], delivered: Mapping[str, Any], leave_out: list[str]
) -> str:
    """The other sources with their transports, ``"self (local), hooks (webhook)"``: the
    declared ones and those only a local destination names."""
    kinds = {name: "local" for name in delivered}
    kinds.update({name: source.transport for name, source in sources.items()})
    return ", ".join(
        f"{name} ({kind})" for name, kind in sorted(kinds.items()) if name not in leave_out
    )


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
            "sources",
            nargs="*",
            help="Source names (default: every kombu source; with none configured, only "
            "handle what is due from the other sources).",
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
        add_metrics_port(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        serve_metrics(options)
        config = get_settings()
        inbox = config.inbox
        # Sources whose messages need no consumer: this service's own outbox stores them.
        delivered = local_sources(config.outbox.destinations.values())
        names = options["sources"] or [
            name for name, source in inbox.sources.items() if source.transport == "kombu"
        ]
        others = _listing(inbox.sources, delivered, names)
        if not names and others:
            if options["no_handle"]:
                raise CommandError(f"no kombu source to store from (the others: {others})")
            # Nothing to consume, but messages arrive otherwise (this service's own
            # outbox, webhooks): without Celery, this is the process that handles them.
            self._handle_due(options, others)
            return
        if not names:
            raise CommandError(
                "no inbox source: add one to DJANGO_OUTBOX['INBOX']['SOURCES'], e.g. "
                "{'orders': {'TRANSPORT': 'kombu', 'URL': 'amqp://…', 'QUEUE': 'orders'}}"
            )
        consumers = []
        for name in names:
            if name in delivered and name not in inbox.sources:
                raise CommandError(f"source {name!r}: {_ARRIVAL['local']}")
            try:
                source = inbox.source(name)
            except Exception as exc:
                raise CommandError(str(exc)) from None
            if source.transport != "kombu":
                raise CommandError(
                    f"source {name!r} is a {source.transport} source, not kombu: "
                    + _ARRIVAL[source.transport].format(name=name)
                )
            consumer_class = (
                RedisConsumer
                if str(source.options.get("url", "")).startswith(("redis://", "rediss://"))
                else KombuConsumer
            )
            consumers.append(
                consumer_class(
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
                + ("storing only" if options["no_handle"] else "storing and handling")
                + (
                    f"; when idle, also handles what is due from: {others}"
                    if others and not options["no_handle"]
                    else ""
                )
            )
        # The handlers' claims carry this process's worker id: if it dies, another
        # worker's heartbeat gives them back within seconds, not after their lease.
        heartbeat.start("inbox", options["database"])
        settle_heap()
        try:
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

    def _handle_due(self, options: dict[str, Any], others: str) -> None:
        """No kombu source: handle what is due from every source until stopped (with
        ``--until-idle``: until nothing is due), as ``outbox_relay`` delivers."""
        loop = WorkerLoop(
            Inbox(using=options["database"], batch_size=options["batch"]),
            interval=KombuConsumer.drain_interval,
            until_empty=options["until_idle"] is not None,
        )
        signal.signal(signal.SIGTERM, loop.stop)
        signal.signal(signal.SIGINT, loop.stop)
        if options["verbosity"] >= 1 and not options["json"]:
            self.stdout.write(
                f"inbox_consume: no kombu source to consume; handling what is due from: {others}"
            )
        settle_heap()
        total = ConsumeResult(handled=loop.run().done)
        if options["json"]:
            self.stdout.write(json.dumps(total.as_dict(), sort_keys=True))
        elif options["verbosity"] >= 1:
            self.stdout.write(f"inbox_consume stopped: {total.handled} handled")

    def _failure(self, consumer: KombuConsumer, exc: BaseException) -> str:
        """The one line the command ends with when *consumer* failed."""
        if isinstance(exc, SourceUnavailable):
            return str(exc)
        # Not the broker's doing (a bug, the database refusing everything): the
        # traceback is needed to fix it.
        logger.error("inbox source %r stopped", consumer.source.name, exc_info=exc)
        return f"inbox source {consumer.source.name!r} stopped: {type(exc).__name__}: {exc}"
