"""``manage.py inbox_worker``: handle due inbox messages without Celery."""

from __future__ import annotations

from typing import Any

from django.db import connections

from django_outbox.engine.runner import Runner
from django_outbox.inbox.handling import Inbox
from django_outbox.management.commands._worker import WorkerCommand


class Command(WorkerCommand):
    help = (
        "Handle due inbox messages in the foreground (without Celery, or beside it): "
        "messages that came through receive(), the webhook view, the local transport or "
        "inbox_consume --no-handle, retries that came due, requeued ones. Wakes on PostgreSQL "
        "NOTIFY where available (DISPATCH 'notify'), otherwise polls; stops cleanly on "
        "SIGTERM/SIGINT after the batch in hand. While it runs it keeps a heartbeat: if it "
        "dies, its claims come back within seconds."
    )
    name = "inbox_worker"
    noun = "message"
    done_verb = "handled"
    batch_help = "Exit after this many batches that handled messages (idle polls do not count)."
    prefetches = False  # lock mode: a message is claimed only as it is handled

    def runner(self, options: dict[str, Any]) -> Runner:
        return Inbox(using=options["database"], batch_size=options["batch"])

    def banner(self, runner: Runner, options: dict[str, Any]) -> str:
        connection = connections[runner.using]
        return (
            f"inbox_worker: database {runner.using!r} ({connection.vendor}), "
            f"batch {runner.batch_size}"
        )
