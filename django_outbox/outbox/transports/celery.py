"""Celery transport: ``send_task`` to another service's task.

The remote task is called with the payload as its only positional argument;
its Celery task id is the message id (so the remote side can deduplicate),
and the ``outbox-*`` values travel as message headers.
"""

from __future__ import annotations

from celery import current_app

from django_outbox.exceptions import RetryableError
from django_outbox.outbox.envelope import Envelope
from django_outbox.outbox.transports.base import Transport


class CeleryTransport(Transport):
    """Options: ``TASK`` (required, the remote task's name), ``QUEUE`` (optional)."""

    required_options = ("task",)

    def publish_one(self, envelope: Envelope) -> None:
        app = current_app
        try:
            with app.producer_or_acquire() as producer:
                app.send_task(
                    str(self.options["task"]),
                    args=[envelope.payload],
                    task_id=str(envelope.message_id),
                    queue=self.options.get("queue"),
                    headers=envelope.headers,
                    producer=producer,
                    retry=False,
                )
        except Exception as exc:
            raise RetryableError(f"{type(exc).__name__}: {exc}") from exc
