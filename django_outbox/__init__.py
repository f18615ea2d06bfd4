"""django-outbox: a transactional outbox and an idempotent inbox for Django and Celery.

Public API::

    from django_outbox import send
    with transaction.atomic():
        order.save()
        send("order.created", {"id": order.pk}, to="orders", key=f"order:{order.pk}")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_outbox.exceptions import (
    ConfigurationError,
    DeliveryError,
    InvalidMessage,
    KeyConflict,
    OutboxError,
    PayloadError,
    PayloadTooLarge,
    PermanentError,
    RetryableError,
    UncertainError,
    UnknownDestination,
)

if TYPE_CHECKING:
    from django_outbox.inbox.api import receive
    from django_outbox.inbox.handlers import handler
    from django_outbox.outbox.api import send

__all__ = [
    "ConfigurationError",
    "DeliveryError",
    "InvalidMessage",
    "KeyConflict",
    "OutboxError",
    "PayloadError",
    "PayloadTooLarge",
    "PermanentError",
    "RetryableError",
    "UncertainError",
    "UnknownDestination",
    "handler",
    "receive",
    "send",
]


def __getattr__(name: str) -> Any:
    # send() needs the models, which may not be imported before apps are ready. Once
    # imported, a name is kept in the module: later lookups (one per send() written as
    # ``django_outbox.send``) find it without coming here.
    value: Any
    if name == "send":
        from django_outbox.outbox.api import send

        value = send
    elif name == "receive":
        from django_outbox.inbox.api import receive

        value = receive
    elif name == "handler":
        from django_outbox.inbox.handlers import handler

        value = handler
    else:
        raise AttributeError(f"module 'django_outbox' has no attribute {name!r}")
    globals()[name] = value
    return value
