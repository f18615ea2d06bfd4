"""Celery transport: ``send_task`` to another service's task.

The remote task is called with the payload as its only positional argument;
its Celery task id is the message id (so the remote side can deduplicate),
and the ``outbox-*`` values travel as message headers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery import current_app

from django_outbox.exceptions import RetryableError
from django_outbox.outbox.envelope import Envelope
from django_outbox.outbox.transports.base import Outcomes, Transport


class CeleryTransport(Transport):
    """Options: ``TASK`` (required, the remote task's name), ``QUEUE`` (optional).

    Publishes through the project's Celery app and its broker connection pool;
    one producer serves a whole batch.
    """

    required_options = ("task",)

    def publish(self, envelopes: Sequence[Envelope], deadline: float | None = None) -> Outcomes:
        app = current_app
        try:
            with app.producer_or_acquire() as producer:
                self._producer: Any = producer
                return super().publish(envelopes, deadline)
        except Exception as exc:  # acquiring the producer failed: nothing was sent
            error = RetryableError(f"{type(exc).__name__}: {exc}")
            return dict.fromkeys((e.message_id for e in envelopes), error)
        finally:
            self._producer = None

    def publish_one(self, envelope: Envelope) -> None:
        try:
            current_app.send_task(
                str(self.options["task"]),
                args=[envelope.payload],
                task_id=str(envelope.message_id),
                queue=self.options.get("queue"),
                headers=envelope.headers,
                producer=self._producer,
                retry=False,
            )
        except Exception as exc:
            raise RetryableError(f"{type(exc).__name__}: {exc}") from exc
