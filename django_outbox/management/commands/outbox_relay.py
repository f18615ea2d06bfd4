from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser
from django.db import connections

from django_outbox.engine.runner import Runner
from django_outbox.management.commands._args import non_negative_int
from django_outbox.management.commands._worker import WorkerCommand
from django_outbox.outbox.relay import Relay


class Command(WorkerCommand):
    help = (
        "Run the outbox relay in the foreground (for projects without Celery). Wakes on "
        "PostgreSQL NOTIFY where available, otherwise polls; stops cleanly on SIGTERM/SIGINT. "
        "While it runs it keeps a heartbeat: if it dies, the messages it held are sent by "
        "another relay within seconds."
    )
    name = "outbox_relay"
    noun = "row"
    done_verb = "sent"
    batch_help = "Exit after this many batches that carried messages (idle polls do not count)."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--unconfirmed-batches",
            type=non_negative_int,
            default=Runner.waiting_batches,
            help="Batches handed to RabbitMQ whose publisher confirms the relay awaits "
            f"while it publishes the next ones (default {Runner.waiting_batches}; 0 awaits "
            "each batch's confirms before the next). After a crash, up to this many "
            "batches more are uncertain (resent, or held with UNCERTAIN 'hold').",
        )

    def runner(self, options: dict[str, Any]) -> Runner:
        relay = Relay(using=options["database"], batch_size=options["batch"])
        relay.waiting_batches = options["unconfirmed_batches"]
        return relay

    def banner(self, runner: Runner, options: dict[str, Any]) -> str:
        part = runner.part
        connection = connections[part.using]
        destinations = ", ".join(
            f"{name} ({d.transport})" for name, d in part.settings.outbox.destinations.items()
        )
        return (
            f"outbox_relay: database {part.using!r} ({connection.vendor}), "
            f"dispatch {part.settings.dispatch}, batch {runner.batch_size}, "
            f"destinations: {destinations or 'none configured'}"
        )
