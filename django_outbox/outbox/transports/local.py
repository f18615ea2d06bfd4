"""Local transport: deliver into this service's own inbox, in its own database.

``{"TRANSPORT": "local", "SOURCE": "self"}`` hands each message to
``receive(source="self", message_id=<the outbox message id>, ...)``: the
inbox's handlers run for it as for any incoming message (on commit, with
retries, ordering and the admin). Declare the source too
(``"INBOX": {"SOURCES": {"self": {"TRANSPORT": "local"}}}``), so that it
has its settings (``REPLY_TO`` …) and system checks can pair the two halves
(``django_outbox.W006``, ``E008``, ``W007``). A batch is stored in one transaction; if
the relay dies before recording it as sent, the second delivery finds the
messages stored and changes nothing. ``USING`` names another database alias
(default: the outbox's own).

This is the documented seam between the parts: the outbox calls the inbox's
``receive()``, nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.db import DatabaseError, transaction

from django_outbox.conf import Destination
from django_outbox.exceptions import (
    ConfigurationError,
    InvalidMessage,
    PermanentError,
    RetryableError,
)
from django_outbox.outbox.envelope import Envelope
from django_outbox.outbox.transports.base import Outcomes, Transport

#: The inbox source of a local destination without ``SOURCE``.
DEFAULT_SOURCE = "local"


class LocalTransport(Transport):
    """Options: ``SOURCE`` (the inbox source name, default ``"local"``), ``USING``."""

    known_options = frozenset({"source", "using"})

    def publish(self, envelopes: Sequence[Envelope], deadline: float | None = None) -> Outcomes:
        from django_outbox.inbox.api import receive

        source = str(self.options.get("source") or DEFAULT_SOURCE)
        using = self.options.get("using")
        outcomes: Outcomes = {}
        try:
            with transaction.atomic(using=using):
                for envelope in envelopes:
                    try:
                        receive(
                            envelope.type,
                            envelope.payload,
                            source=source,
                            message_id=str(envelope.message_id),
                            key=envelope.key,
                            sequence=envelope.sequence,
                            headers=dict(envelope.user_headers),
                            correlation_id=envelope.correlation_id,
                            using=using,
                        )
                        outcomes[envelope.message_id] = None
                    except InvalidMessage as exc:
                        outcomes[envelope.message_id] = PermanentError(str(exc))
        except DatabaseError as exc:
            error = RetryableError(f"{type(exc).__name__}: {exc}")
            return dict.fromkeys((e.message_id for e in envelopes), error)
        return outcomes

    def publish_one(self, envelope: Envelope) -> None:
        self.publish([envelope])


def local_sources(destinations: Iterable[Destination]) -> dict[str, list[str]]:
    """The inbox sources that local destinations deliver into, each with the names of
    those destinations (a destination whose transport cannot be imported is left out:
    system check E002 reports it)."""
    from django_outbox.outbox.transports.registry import transport_class

    found: dict[str, list[str]] = {}
    for destination in destinations:
        try:
            local = issubclass(transport_class(destination), LocalTransport)
        except ConfigurationError:
            continue
        if local:
            source = str(destination.options.get("source") or DEFAULT_SOURCE)
            found.setdefault(source, []).append(destination.name)
    return found
