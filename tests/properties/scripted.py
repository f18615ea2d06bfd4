"""A transport whose outcome per message a property test chooses before each batch."""

from __future__ import annotations

import threading
import uuid

from django_outbox.exceptions import PermanentError, RetryableError, UncertainError
from django_outbox.outbox.envelope import Envelope
from django_outbox.outbox.transports.base import Transport

#: What the next publish of a message does: "ok", "retry", "fail" or "uncertain"
#: (default "ok").
script: dict[uuid.UUID, str] = {}
#: Every publish attempt, in order: (message id, what it did).
log: list[tuple[uuid.UUID, str]] = []
_lock = threading.Lock()


class ScriptedTransport(Transport):
    """Publishes nothing; raises what ``script`` says for each envelope."""

    known_options = frozenset()

    def publish_one(self, envelope: Envelope) -> None:
        outcome = script.get(envelope.message_id, "ok")
        with _lock:
            log.append((envelope.message_id, outcome))
        if outcome == "retry":
            raise RetryableError("scripted: the broker said try again")
        if outcome == "fail":
            raise PermanentError("scripted: the broker refused it")
        if outcome == "uncertain":
            raise UncertainError("scripted: no confirm came back")


def reset() -> None:
    with _lock:
        script.clear()
        log.clear()
