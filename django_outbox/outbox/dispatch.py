"""On-commit triggers: one dispatch per transaction, carrying all its message ids."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.db import connections, transaction

from django_outbox.conf import get_settings

logger = logging.getLogger("django_outbox.dispatch")

_ATTRIBUTE = "_django_outbox_trigger"


class Trigger:
    """Collects the ids sent in one transaction and dispatches them once after commit.

    ``send()`` registers the same trigger with ``on_commit`` for every message,
    so the trigger survives the rollback of a savepoint that registered it
    first; it runs once, on the first call. Ids of rows rolled back with a
    savepoint are harmless: the relay finds nothing to claim for them.
    """

    __slots__ = ("fired", "ids", "using")

    def __init__(self, using: str) -> None:
        self.using = using
        self.ids: list[int] = []
        self.fired = False

    def __call__(self) -> None:
        if self.fired:
            return
        self.fired = True
        dispatch(self.using, self.ids)


def schedule(using: str, pk: int) -> None:
    """Arrange for message *pk* to be dispatched when the current transaction commits."""
    connection = connections[using]
    if not connection.in_atomic_block:
        dispatch(using, [pk])
        return
    trigger: Trigger | None = getattr(connection, _ATTRIBUTE, None)
    if trigger is None or trigger.fired:
        trigger = Trigger(using)
        setattr(connection, _ATTRIBUTE, trigger)
    trigger.ids.append(pk)
    transaction.on_commit(trigger, using=using)


def dispatch(using: str, ids: Sequence[int]) -> None:
    """Wake a relay for *ids* as ``DISPATCH`` says; never raises (the sweep is the backstop)."""
    mode = get_settings().dispatch
    try:
        if mode == "celery":
            from django_outbox.tasks import deliver_messages

            queue = get_settings().deliver_task_queue
            options: dict[str, Any] = {"queue": queue} if queue else {}
            deliver_messages.apply_async(
                args=(list(ids),), kwargs={"using": using}, retry=False, **options
            )
        elif mode == "notify":
            connection = connections[using]
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_notify(%s, '')", [get_settings().notify_channel])
    except Exception:
        # The rows are committed; the recovery sweep will deliver them.
        logger.exception(
            "could not dispatch %d outbox message(s) (%s); the sweep will deliver them",
            len(ids),
            mode,
        )
