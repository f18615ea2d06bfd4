"""In-memory transport for tests: published envelopes land in a list.

Tests observe what the relay published here. To deliver into this service's
own inbox, use the ``local`` transport.
"""

from __future__ import annotations

import threading
from collections import defaultdict

from django_outbox.outbox.envelope import Envelope
from django_outbox.outbox.transports.base import Transport

_lock = threading.Lock()
#: Published envelopes per destination name, in publish order.
mailbox: defaultdict[str, list[Envelope]] = defaultdict(list)


class MemoryTransport(Transport):
    """Appends each envelope to ``mailbox[destination]`` (this process only)."""

    known_options = frozenset()

    def publish_one(self, envelope: Envelope) -> None:
        with _lock:
            mailbox[self.destination.name].append(envelope)


def clear() -> None:
    """Forget everything published so far."""
    with _lock:
        mailbox.clear()
