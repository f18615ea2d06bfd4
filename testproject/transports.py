"""Transports used by the test suite and the demo (not part of the library)."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import redis

from django_outbox.conf import Destination
from django_outbox.exceptions import PermanentError, RetryableError
from django_outbox.outbox.envelope import Envelope
from django_outbox.outbox.transports.base import Transport
from django_outbox.outbox.transports.kombu import KombuTransport


class RecordingTransport(Transport):
    """RPUSHes ``[key, sequence, message_id]`` to a Redis list in publish order.

    Options: ``REDIS_URL``, ``LIST``; ``FAIL_KEY`` with ``FAIL_RATE`` (retryable
    failures drawn at random) and ``FAIL_PERMANENTLY_AT`` (the sequence of
    ``FAIL_KEY`` that fails permanently).
    """

    required_options = ("redis_url", "list")

    def __init__(self, destination: Destination) -> None:
        super().__init__(destination)
        self.client = redis.Redis.from_url(self.options["redis_url"])
        self.fail_key = self.options.get("fail_key")
        self.fail_rate = float(self.options.get("fail_rate", 0))
        self.fail_at = self.options.get("fail_permanently_at")
        self.rng = random.Random()

    def publish_one(self, envelope: Envelope) -> None:
        if envelope.key is not None and envelope.key == self.fail_key:
            if envelope.sequence == self.fail_at:
                raise PermanentError(f"injected permanent failure at sequence {self.fail_at}")
            if self.rng.random() < self.fail_rate:
                raise RetryableError("injected retryable failure")
        entry = [envelope.key, envelope.sequence, str(envelope.message_id)]
        self.client.rpush(self.options["list"], json.dumps(entry))


class SlowKombuTransport(KombuTransport):
    """The kombu transport with a pause per message (``DELAY`` seconds): the demo's
    way to keep a worker busy long enough to be killed mid-way."""

    known_options = KombuTransport.known_options | {"delay"}

    def publish(self, envelopes: Any, deadline: float | None = None) -> Any:
        # Half the pause before publishing, half after: a kill can land on
        # either side of the publish, as in real life.
        pause = float(self.options.get("delay", 0)) * len(envelopes) / 2
        time.sleep(pause)
        outcomes = super().publish(envelopes)
        time.sleep(pause)
        return outcomes


class BlockingKombuTransport(KombuTransport):
    """The kombu transport that blocks ``BLOCK_SECONDS`` before publishing its first
    batch, after writing the batch's message ids to the file ``BLOCK_MARKER``: a relay
    that holds a batch and is slow (or, killed meanwhile, dead) for the recovery tests."""

    blocked = False
    known_options = KombuTransport.known_options | {"block_seconds", "block_marker"}

    def publish(self, envelopes: Any, deadline: float | None = None) -> Any:
        if not BlockingKombuTransport.blocked:
            BlockingKombuTransport.blocked = True
            with open(self.options["block_marker"], "w") as marker:
                marker.write("\n".join(str(e.message_id) for e in envelopes))
            time.sleep(float(self.options["block_seconds"]))
        return super().publish(envelopes, deadline)
