"""The consumer behind ``manage.py inbox_consume`` for ``redis://`` sources: a message
is always in the queue or in a consumer's processing list until it is stored.

kombu's Redis transport takes a message off the queue with ``BRPOP`` and notes it
in its ``unacked`` hash with a later command. A consumer killed between the two,
or cut off the network after Redis sent the answer, leaves the message nowhere:
Redis has handed it over, the consumer never had it. The chaos run
(``tests/chaos``) lost a message that way.

This consumer moves each message, in one atomic command (``LMOVE``, ``BLMOVE``
when the queue is empty), from the tail of the queue to the head of a list of its
own, ``<queue>:processing:<consumer id>``, and removes it from there (``LREM``) only
after the transaction that stored it committed. While it lives it keeps a key
``<queue>:consumer:<consumer id>`` that expires ``LEASE_SECONDS`` (a source key,
default 15) after its last renewal; a thread renews it every third of that. Every
consumer of the queue moves the processing list of a consumer whose key expired
back to the queue, marked redelivered, and a consumer whose connection to Redis
was lost moves its own back as soon as it is connected again.

The batches, the transaction that stores and handles them, the refusals and the
outages are the kombu consumer's (``KombuConsumer``); only taking, acknowledging
and giving back differ. Messages are read in kombu's Redis format (what our
outbox's Redis transport and kombu publishers write), on the queue's list and on
kombu's priority lists.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import math
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.db import connections

from django_outbox.engine import faults
from django_outbox.inbox.consumers.kombu import KombuConsumer
from django_outbox.inbox.consumers.outage import SourceUnavailable

logger = logging.getLogger("django_outbox.inbox")

#: Seconds a consumer may go without renewing its key before its messages go back.
DEFAULT_LEASE_SECONDS = 15.0
#: kombu's Redis priority lists besides the queue's own (its default steps 3, 6, 9).
PRIORITY_SUFFIXES = ("\x06\x163", "\x06\x166", "\x06\x169")
#: Seconds between two looks for processing lists of consumers that are gone.
RECOVER_EVERY = 2.0
#: Messages taken from one list in one round trip (a pipeline of ``LMOVE``).
TAKE_AT_MOST = 100
#: Seconds a Redis reply may take beyond a blocking command's own timeout.
SOCKET_TIMEOUT = 10.0


@dataclass
class RedisDelivery:
    """One message taken into this consumer's processing list, as ``raw`` bytes there."""

    raw: bytes
    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)
    content_type: str | None = None

    @property
    def delivery_info(self) -> dict[str, Any]:
        info = self.properties.get("delivery_info")
        return info if isinstance(info, dict) else {}

    @classmethod
    def parse(cls, raw: bytes) -> RedisDelivery:
        """Read kombu's Redis message format; anything else is kept whole as the body
        (the inbox stores it as unreadable, with its reason)."""
        try:
            message = json.loads(raw)
        except ValueError:
            return cls(raw=raw, body=raw)
        if not isinstance(message, dict) or not isinstance(message.get("body"), str):
            return cls(raw=raw, body=raw)
        headers = message.get("headers")
        properties = message.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        body = message["body"]
        if properties.get("body_encoding") == "base64":
            try:
                data = base64.b64decode(body, validate=True)
            except (binascii.Error, ValueError):
                data = body.encode("utf-8", "backslashreplace")
        else:
            data = body.encode("utf-8", "backslashreplace")
        content_type = message.get("content-type")
        return cls(
            raw=raw,
            body=data,
            headers=headers if isinstance(headers, dict) else {},
            properties=properties,
            content_type=content_type if isinstance(content_type, str) else None,
        )


def redelivered(raw: bytes) -> bytes:
    """*raw* marked as redelivered (kombu's ``delivery_info.redelivered``), if it is a
    kombu message; other values go back as they were."""
    try:
        message = json.loads(raw)
        properties = message.setdefault("properties", {})
        info = properties.setdefault("delivery_info", {})
        info["redelivered"] = True
        return json.dumps(message, ensure_ascii=False).encode("utf-8")
    except (ValueError, AttributeError, TypeError):
        return raw


def _glob_escaped(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


@dataclass
class RedisConsumer(KombuConsumer):
    """Consumes one ``redis://`` source until told to stop (see the module)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        options = self.source.options
        self.url = str(options["url"])
        self.queue = str(options["queue"])
        self.consumer_id = uuid.uuid4().hex
        self.processing_key = self.processing_of(self.consumer_id)
        self.lease_seconds = float(options.get("lease_seconds") or DEFAULT_LEASE_SECONDS)
        self._keys = (self.queue, *(self.queue + suffix for suffix in PRIORITY_SUFFIXES))
        #: Priority lists that had messages the last time they were asked.
        self._busy: set[str] = set()
        self._renewing = threading.Event()
        self._renewer: threading.Thread | None = None
        self._next_recovery = 0.0
        self._client: Any = None

    def processing_of(self, consumer_id: str) -> str:
        return f"{self.queue}:processing:{consumer_id}"

    def alive_key_of(self, consumer_id: str) -> str:
        return f"{self.queue}:consumer:{consumer_id}"

    @property
    def safe_url(self) -> str:
        import kombu

        return str(kombu.Connection(self.url).as_uri())

    # -- running ---------------------------------------------------------------------

    def run(self, *, until_idle: float | None = None, max_messages: int | None = None) -> None:
        """Consume until stopped, idle for *until_idle* seconds, or after *max_messages*;
        reconnect after a lost connection; raise ``SourceUnavailable`` when Redis was
        away for ``max_outage`` seconds or refused this consumer."""
        import redis

        try:
            while not self.stop_event.is_set():
                connected = False
                try:
                    self._client = self._new_client()
                    self._client.ping()
                    connected = True
                    self._consume_redis(until_idle=until_idle, max_messages=max_messages)
                    return
                except (redis.AuthenticationError, redis.ResponseError) as exc:
                    raise SourceUnavailable(
                        f"inbox source {self.source.name!r}: {self.safe_url} refused the "
                        f"consumer ({type(exc).__name__}: {exc}); reconnecting cannot fix this"
                    ) from exc
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    # What was in hand stays in the processing list: this consumer
                    # moves it back once connected again (or another, after the lease).
                    self._pending = []
                    self._close_client()
                    if self.stop_event.is_set():
                        return
                    self._outage = self._wait_out(exc, url=self.safe_url, connected=connected)
        finally:
            self._renewing.set()
            if self._client is not None:
                with contextlib.suppress(Exception):
                    self._client.delete(self.alive_key_of(self.consumer_id))
            self._close_client()
            connections[self.using].close()

    def _new_client(self) -> Any:
        import redis

        return redis.Redis.from_url(
            self.url,
            socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=SOCKET_TIMEOUT,
            health_check_interval=0,
        )

    def _close_client(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
        self._client = None

    def _consume_redis(self, *, until_idle: float | None, max_messages: int | None) -> None:
        client = self._client
        self._renew(client)
        self._start_renewing()
        # Left by this consumer's lost connection: back to the queue, redelivered.
        self._move_back(client, self.processing_key, owner="this consumer, reconnected")
        if self._outage is not None:
            logger.info(
                "inbox source %r: connected to %s again after %.1f s (%d failed tr%s)",
                self.source.name,
                self.safe_url,
                self._outage.lasted(time.monotonic()),
                self._outage.failures,
                "y" if self._outage.failures == 1 else "ies",
            )
            self._outage = None
        idle_since = time.monotonic()
        batch_started: float | None = None
        last_drain = 0.0
        while not self.stop_event.is_set():
            got = self._take(client, wait=self.batch_seconds if self._pending else 0.2)
            now = time.monotonic()
            if self._pending:
                idle_since = now
                batch_started = batch_started or now
                if (
                    not got
                    or len(self._pending) >= self.batch_size
                    or now - batch_started >= self.batch_seconds
                ):
                    self.flush()
                    batch_started = None
            elif self.handle and now - last_drain >= self.drain_interval:
                self._drain_due()
                last_drain = now
            if now >= self._next_recovery:
                self.recover(client)
                self._next_recovery = now + RECOVER_EVERY
            if max_messages is not None and self.result.received >= max_messages:
                break
            if until_idle is not None and now - idle_since >= until_idle:
                break
        self.flush()

    # -- taking ----------------------------------------------------------------------

    def _take(self, client: Any, *, wait: float) -> int:
        """Move up to a batch's room of messages into the processing list (one round
        trip); when there are none, wait up to *wait* seconds for one. Returns how many
        were taken."""
        room = max(1, min(TAKE_AT_MOST, self.batch_size - len(self._pending)))
        pipe = client.pipeline(transaction=False)
        asked = []
        for key in self._keys:
            # A priority list that had nothing last time is asked for one message.
            count = room if key == self.queue or key in self._busy else 1
            asked.append((key, count))
            for _ in range(count):
                pipe.lmove(key, self.processing_key, "RIGHT", "LEFT")
        results = pipe.execute()
        taken, position = [], 0
        for key, count in asked:
            got = [raw for raw in results[position : position + count] if raw is not None]
            position += count
            taken.extend(got)
            if key != self.queue:
                (self._busy.add if got else self._busy.discard)(key)
        if not taken and wait > 0:
            raw = client.blmove(self.queue, self.processing_key, wait, "RIGHT", "LEFT")
            taken = [raw] if raw is not None else []
        if taken:
            faults.point("inbox.after_take")  # taken off the queue, nothing stored
        self._pending.extend(RedisDelivery.parse(raw) for raw in taken)
        return len(taken)

    # -- acknowledging and giving back -----------------------------------------------

    def _ack(self, batch: list[Any]) -> None:
        """Remove *batch*, stored and committed, from the processing list."""
        if not batch:
            return
        pipe = self._client.pipeline(transaction=False)
        for delivery in batch:
            pipe.lrem(self.processing_key, 1, delivery.raw)
        pipe.execute()

    def _give_back(self, batch: list[Any]) -> None:
        """Return *batch*, not stored, to the tail of the queue, first message last (so
        it is the next one taken), in one transaction."""
        try:
            pipe = self._client.pipeline(transaction=True)
            for delivery in reversed(batch):
                pipe.lrem(self.processing_key, 1, delivery.raw)
                pipe.rpush(self.queue, delivery.raw)
            pipe.execute()
        except Exception:  # Redis is away too: the list goes back when it answers again
            logger.debug("giving back to %s failed", self.queue, exc_info=True)

    def _reject(self, message: Any) -> None:
        """Drop *message*, which the database refused even as unreadable (logged at
        ERROR by the caller)."""
        self._client.lrem(self.processing_key, 1, message.raw)

    # -- leases ----------------------------------------------------------------------

    def _renew(self, client: Any) -> None:
        client.set(
            self.alive_key_of(self.consumer_id),
            "1",
            px=max(1, math.ceil(self.lease_seconds * 1000)),
        )

    def _start_renewing(self) -> None:
        if self._renewer is not None and self._renewer.is_alive():
            return
        self._renewing.clear()
        self._renewer = threading.Thread(
            target=self._renew_forever, name=f"inbox-lease-{self.source.name}", daemon=True
        )
        self._renewer.start()

    def _renew_forever(self) -> None:
        import redis

        client = self._new_client()
        try:
            while not self._renewing.wait(self.lease_seconds / 3):
                try:
                    self._renew(client)
                except redis.RedisError:
                    logger.debug("renewing the lease of %s failed", self.consumer_id)
        finally:
            client.close()

    def recover(self, client: Any) -> int:
        """Move the processing lists of this queue's consumers whose key expired back to
        the queue. Returns how many messages went back."""
        moved = 0
        pattern = f"{_glob_escaped(self.queue)}:processing:*"
        for key in client.scan_iter(match=pattern, count=100):
            name = key.decode() if isinstance(key, bytes) else str(key)
            consumer_id = name.rsplit(":", 1)[1]
            if consumer_id == self.consumer_id:
                continue
            if client.exists(self.alive_key_of(consumer_id)):
                continue
            moved += self._move_back(client, name, owner=f"consumer {consumer_id}, gone")
        return moved

    def _move_back(self, client: Any, key: str, *, owner: str) -> int:
        """Move every message of processing list *key* to the tail of the queue, oldest
        last (the next taken), marked redelivered, in one transaction."""
        import redis

        with client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    items = pipe.lrange(key, 0, -1)
                    if not items:
                        pipe.unwatch()
                        return 0
                    pipe.multi()
                    # The list holds the newest first: pushed in that order onto the
                    # tail, the oldest ends last, and is taken first.
                    pipe.rpush(self.queue, *(redelivered(raw) for raw in items))
                    pipe.delete(key)
                    pipe.execute()
                except redis.WatchError:
                    continue
                logger.warning(
                    "inbox source %r: %d message(s) taken by %s go back to %s, redelivered",
                    self.source.name,
                    len(items),
                    owner,
                    self.queue,
                )
                return len(items)
