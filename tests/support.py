"""Test doubles that run inside the relay (importable by child processes too)."""

from __future__ import annotations

from django_outbox.exceptions import PermanentError, RetryableError
from django_outbox.outbox.envelope import Envelope
from django_outbox.outbox.transports.memory import MemoryTransport


class ScriptedTransport(MemoryTransport):
    """Publishes to memory, except types ``fail.retry``/``fail.permanent`` and
    payloads ``{"fail": "retry"|"permanent"}`` which raise the matching error."""

    def publish_one(self, envelope: Envelope) -> None:
        verdict = envelope.type.removeprefix("fail.") if envelope.type.startswith("fail.") else None
        if isinstance(envelope.payload, dict):
            verdict = envelope.payload.get("fail", verdict)
        if verdict == "retry":
            raise RetryableError("broker said try later")
        if verdict == "permanent":
            raise PermanentError("422 unprocessable")
        super().publish_one(envelope)


class SlowTransport(MemoryTransport):
    """Memory transport taking ``DELAY`` seconds per message."""

    known_options = frozenset({"delay"})

    def publish_one(self, envelope: Envelope) -> None:
        import time

        time.sleep(float(self.options.get("delay", 0)))
        super().publish_one(envelope)
