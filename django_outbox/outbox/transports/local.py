"""Local transport: deliver into this service's own inbox, in its own database.

``{"TRANSPORT": "local", "SOURCE": "self"}`` hands each message to
``receive(source="self", message_id=<the outbox message id>, ...)``: the
inbox's handlers run for it as for any incoming message (on commit, with
retries, ordering and the admin). A batch is stored in one transaction; if
the relay dies before recording it as sent, the second delivery finds the
messages stored and changes nothing. ``USING`` names another database alias
(default: the outbox's own).

This is the documented seam between the parts: the outbox calls the inbox's
``receive()``, nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import DatabaseError, transaction

from django_outbox.exceptions import InvalidMessage, PermanentError, RetryableError
from django_outbox.outbox.envelope import Envelope
from django_outbox.outbox.transports.base import Outcomes, Transport


class LocalTransport(Transport):
    """Options: ``SOURCE`` (the inbox source name, default ``"local"``), ``USING``."""

    known_options = frozenset({"source", "using"})

    def publish(self, envelopes: Sequence[Envelope], deadline: float | None = None) -> Outcomes:
        from django_outbox.inbox.api import receive

        source = str(self.options.get("source") or "local")
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
