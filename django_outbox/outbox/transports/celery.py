"""Celery transport: ``send_task`` to another service's task.

The remote task is called with the payload as its only positional argument;
its Celery task id is the message id (so the remote side can deduplicate),
and the ``outbox-*`` values travel as message headers.

Celery publishes without waiting for the broker unless its transport is told
to: on RabbitMQ set ``CELERY_BROKER_TRANSPORT_OPTIONS = {"confirm_publish":
True}``, or a broker crash loses messages already recorded as sent. System
check ``django_outbox.W016`` says so when it is missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery import current_app
from django.core import checks

from django_outbox.conf import Destination
from django_outbox.exceptions import (
    ConnectionLostError,
    RetryableError,
    UncertainError,
    UnreachableError,
)
from django_outbox.outbox.envelope import Envelope
from django_outbox.outbox.transports.base import Outcomes, Transport

AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")


def confirms_publishes(app: Any) -> bool:
    """Whether *app* waits for RabbitMQ's publisher confirms (non-AMQP brokers: True)."""
    url = str(app.conf.broker_write_url or app.conf.broker_url or "")
    if not url.split("://", 1)[0].lower().startswith(AMQP_SCHEMES):
        return True
    options = app.conf.broker_transport_options or {}
    return bool(options.get("confirm_publish"))


class CeleryTransport(Transport):
    """Options: ``TASK`` (required, the remote task's name), ``QUEUE`` (optional).

    Publishes through the project's Celery app and its broker connection pool;
    one producer serves a whole batch.
    """

    required_options = ("task",)
    known_options = frozenset({"task", "queue"})

    @classmethod
    def check(cls, destination: Destination) -> list[checks.CheckMessage]:
        problems = super().check(destination)
        app: Any = current_app
        if not confirms_publishes(app):
            problems.append(
                checks.Warning(
                    f"destination {destination.name!r}: the Celery app publishes to RabbitMQ "
                    "without publisher confirms, so a message is recorded as sent as soon as "
                    "it is written to the socket: a broker crash can lose it",
                    hint="Set CELERY_BROKER_TRANSPORT_OPTIONS = {'confirm_publish': True}, or "
                    "use the kombu transport (confirms per batch).",
                    id="django_outbox.W016",
                )
            )
        return problems

    def publish(self, envelopes: Sequence[Envelope], deadline: float | None = None) -> Outcomes:
        app = current_app
        try:
            with app.producer_or_acquire() as producer:
                self._producer: Any = producer
                return super().publish(envelopes, deadline)
        except Exception as exc:  # acquiring the producer failed: nothing was sent
            text = f"{type(exc).__name__}: {exc}"
            error = UnreachableError(text) if _broker_away(exc) else RetryableError(text)
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
            text = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, ConnectionRefusedError) or "Connection refused" in str(exc):
                raise UnreachableError(text) from exc  # nothing left this process
            if type(exc).__name__ == "MessageNacked":
                raise RetryableError(text) from exc  # the broker said it did not take it
            if _broker_away(exc):
                # The connection broke with the message maybe written: uncertain, and
                # the broker is away for the next ones (the destination's circuit).
                raise ConnectionLostError(text) from exc
            # The task message may have been written before the error (a lost
            # confirm, a connection reset): uncertain, parked under "hold".
            raise UncertainError(text) from exc


def _broker_away(exc: BaseException) -> bool:
    """Whether *exc* says the broker cannot be reached or dropped the connection (not
    that it refused this message); our own timeouts are not counted as that."""
    if isinstance(exc, TimeoutError):
        return False
    from kombu.exceptions import OperationalError

    return isinstance(exc, (OSError, OperationalError))
