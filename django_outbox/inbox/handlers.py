"""The handler registry: one handler per message type.

Handlers live in a ``handlers`` module of any installed app and are found
when Django starts (the way the admin finds ``admin.py``)::

    # orders/handlers.py
    import django_outbox

    @django_outbox.handler("payment.captured", ordering="latest", retry_on=(ConnectionError,))
    def payment_captured(message):
        Order.objects.filter(pk=message.payload["order_id"]).update(paid=True)

A handler gets the :class:`~django_outbox.inbox.models.InboxMessage` and runs
in the transaction that marks it ``handled``: its database writes (and any
``send()``) commit together with that mark, or not at all.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from django_outbox.exceptions import ConfigurationError

Ordering = Literal["latest", "strict"]
ORDERINGS: tuple[str, ...] = ("latest", "strict")

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Handler:
    """A registered handler and how it wants its messages."""

    type: str
    function: Callable[[Any], Any]
    #: ``None``: any order; ``"latest"``: older than the key's newest handled are
    #: skipped; ``"strict"``: sequence n waits for n-1.
    ordering: Ordering | None
    #: Exceptions that mean "try again later" (besides ``RetryableError``).
    retry_on: tuple[builtins.type[BaseException], ...]

    @property
    def name(self) -> str:
        return f"{self.function.__module__}.{self.function.__qualname__}"


_handlers: dict[str, Handler] = {}


def handler(
    type: str,
    *,
    ordering: Ordering | None = None,
    retry_on: tuple[type[BaseException], ...] = (),
) -> Callable[[F], F]:
    """Register the decorated function as the handler of messages of *type*."""
    if not isinstance(type, str) or not type:
        raise ConfigurationError(f"handler(): the type must be a non-empty string, got {type!r}")
    if ordering is not None and ordering not in ORDERINGS:
        raise ConfigurationError(
            f"handler({type!r}): ordering must be None, 'latest' or 'strict', got {ordering!r}"
        )
    retry_on = tuple(retry_on)
    if not all(isinstance(e, builtins.type) and issubclass(e, BaseException) for e in retry_on):
        raise ConfigurationError(f"handler({type!r}): retry_on must hold exception classes")

    def register(function: F) -> F:
        existing = _handlers.get(type)
        new = Handler(type=type, function=function, ordering=ordering, retry_on=retry_on)
        if existing is not None and existing.name != new.name:
            raise ConfigurationError(
                f"two handlers for message type {type!r}: {existing.name} and {new.name}; "
                "one type has one handler"
            )
        _handlers[type] = new
        return function

    return register


def get_handler(type: str) -> Handler | None:
    """The handler registered for *type*, if any."""
    return _handlers.get(type)


def registered_handlers() -> dict[str, Handler]:
    """Every registered handler, by type."""
    return dict(_handlers)


def unregister(type: str) -> None:
    """Forget the handler of *type* (tests)."""
    _handlers.pop(type, None)


def autodiscover() -> None:
    """Import the ``handlers`` module of every installed app."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("handlers")
