"""Helpers for testing code that sends through the outbox.

Configure a destination with ``"TRANSPORT": "memory"`` and ``"DISPATCH":
"none"`` in your test settings, then::

    from django_outbox import testing

    def test_order_announces_itself(db):
        place_order(...)
        testing.assert_message_recorded("order.created", {"order_id": order.pk}, to="orders")
        testing.deliver_now()
        assert [e.type for e in testing.published("orders")] == ["order.created"]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from django_outbox.outbox.envelope import Envelope
from django_outbox.outbox.models import OutboxMessage, OutboxMessageQuerySet
from django_outbox.outbox.relay import Relay, RelayResult
from django_outbox.outbox.transports import memory


def recorded(
    type: str | None = None, *, to: str | None = None, using: str = DEFAULT_DB_ALIAS
) -> OutboxMessageQuerySet:
    """Outbox rows visible to this connection (including the open transaction's), oldest first."""
    rows = OutboxMessage.objects.using(using).order_by("id")
    if type is not None:
        rows = rows.filter(type=type)
    if to is not None:
        rows = rows.filter(destination=to)
    return rows


def assert_message_recorded(
    type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    to: str | None = None,
    key: str | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> OutboxMessage:
    """Assert exactly one message of *type* was recorded whose payload contains *payload*.

    Returns that message. The failure message lists what was recorded instead.
    """
    candidates = list(recorded(type, to=to, using=using))
    if key is not None:
        candidates = [m for m in candidates if m.key == key]
    if payload is not None:
        candidates = [m for m in candidates if _contains(m.payload, payload)]
    if len(candidates) == 1:
        return candidates[0]
    everything = [
        f"{m.type} → {m.destination} key={m.key} payload={m.payload}" for m in recorded(using=using)
    ]
    wanted = f"{type!r}" + (f" with payload ⊇ {dict(payload)!r}" if payload else "")
    raise AssertionError(
        f"expected exactly one outbox message {wanted}, found {len(candidates)}; recorded: "
        + ("; ".join(everything) or "nothing")
    )


def deliver_now(*, using: str = DEFAULT_DB_ALIAS) -> RelayResult:
    """Publish everything due right now, in this thread (what the Celery task would do)."""
    result = Relay(using=using).drain(time_budget=60)
    assert isinstance(result, RelayResult)
    return result


def published(destination: str = "default") -> list[Envelope]:
    """Envelopes the memory transport published to *destination* in this process."""
    return list(memory.mailbox[destination])


def clear_published() -> None:
    """Forget what the memory transport published (call between tests)."""
    memory.clear()


def _contains(actual: Any, expected: Mapping[str, Any]) -> bool:
    return isinstance(actual, Mapping) and all(
        k in actual and actual[k] == v for k, v in expected.items()
    )
