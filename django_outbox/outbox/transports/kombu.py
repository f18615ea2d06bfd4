"""kombu transport: RabbitMQ with batched publisher confirms, Redis, and any kombu URL.

The strategy follows the URL scheme:

* ``amqp://`` / ``amqps://`` publish a whole batch, then wait once for the
  broker's confirms (persistent delivery, ``delivery_mode=2``). Waiting per
  message would cap throughput near 750 msgs/s; per batch it does not.
* ``redis://`` / ``rediss://`` push the batch with one ``LPUSH`` of messages in
  kombu's own wire format, so any kombu or Celery consumer of the queue reads
  them, at pipelined speed instead of one round trip per message.
* anything else (``memory://``, ``filesystem://`` …) goes through kombu's
  ``Producer`` one message at a time.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring as quote
from typing import Any
from uuid import UUID

import kombu
from django.core import checks
from kombu.utils.url import maybe_sanitize_url

from django_outbox.conf import Destination
from django_outbox.exceptions import (
    ConnectionLostError,
    DeliveryError,
    PermanentError,
    RetryableError,
    UncertainError,
    UnreachableError,
)
from django_outbox.outbox.envelope import Envelope
from django_outbox.outbox.transports.base import Outcomes, Transport

logger = logging.getLogger("django_outbox.transport.kombu")

AMQP_SCHEMES = frozenset({"amqp", "amqps", "pyamqp"})
REDIS_SCHEMES = frozenset({"redis", "rediss"})


def _scheme(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def _error(exc: BaseException) -> RetryableError:
    return RetryableError(_text(exc))


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _connection_level(exc: BaseException) -> bool:
    """Whether *exc* says the broker is away (refused, reset, closed, unreachable) rather
    than that it refused a message: kombu's ``OperationalError``, py-amqp's connection
    errors and socket errors. Our own wait for confirms running out is not one."""
    if isinstance(exc, TimeoutError):
        return False
    import amqp.exceptions

    return isinstance(
        exc, (OSError, kombu.exceptions.OperationalError, amqp.exceptions.ConnectionError)
    )


class KombuTransport(Transport):
    """Publishes through kombu to the broker at ``URL``.

    Options: ``URL`` (required), ``EXCHANGE`` (default ``""``, the default
    exchange), ``EXCHANGE_TYPE`` (``"direct"``), ``QUEUE`` (declared and bound
    when given), ``ROUTING_KEY`` (default: the queue name, else the message
    type; ``{type}`` and ``{key}`` are substituted), ``BINDING_KEY`` (what
    ``QUEUE`` is bound with; default the routing key when it has no
    placeholders, else the queue name), ``CONFIRM`` (``True``: wait for
    RabbitMQ publisher confirms), ``TIMEOUT`` (seconds, ``10``),
    ``TRANSPORT_OPTIONS`` (passed to kombu for URLs other than amqp/redis).
    """

    required_options = ("url",)
    default_timeout = 10.0
    known_options = frozenset(
        {
            "url",
            "exchange",
            "exchange_type",
            "queue",
            "routing_key",
            "binding_key",
            "confirm",
            "timeout",
            "transport_options",
        }
    )

    def __init__(self, destination: Destination) -> None:
        super().__init__(destination)
        scheme = _scheme(str(self.options["url"]))
        publisher: _Publisher
        if scheme in AMQP_SCHEMES:
            publisher = _AmqpPublisher(self.options)
        elif scheme in REDIS_SCHEMES:
            publisher = _RedisPublisher(self.options)
        else:
            publisher = _ProducerPublisher(self.options)
        self._publisher = publisher
        #: RabbitMQ with confirms: the relay hands the next batch over before it waits.
        self.overlaps = isinstance(publisher, _AmqpPublisher) and publisher.confirm

    @classmethod
    def check(cls, destination: Destination) -> list[checks.CheckMessage]:
        problems = super().check(destination)
        url = str(destination.options.get("url") or "")
        scheme = _scheme(url)
        if url and not scheme:
            problems.append(
                checks.Error(
                    f"destination {destination.name!r}: URL {url!r} has no scheme "
                    "(expected amqp://, redis:// or another kombu URL)",
                    id="django_outbox.E011",
                )
            )
        if scheme in AMQP_SCHEMES and not destination.options.get("confirm", True):
            problems.append(
                checks.Warning(
                    f"destination {destination.name!r}: RabbitMQ without publisher confirms "
                    "can lose messages the broker accepted but did not store",
                    hint="Remove CONFIRM: False.",
                    id="django_outbox.W011",
                )
            )
        options = destination.options
        if (
            options.get("queue")
            and _has_placeholders(options.get("routing_key"))
            and not options.get("binding_key")
            and str(options.get("exchange_type", "direct")) == "direct"
            and scheme not in REDIS_SCHEMES
        ):
            problems.append(
                checks.Error(
                    f"destination {destination.name!r}: ROUTING_KEY {options['routing_key']!r} "
                    f"varies per message but QUEUE {options['queue']!r} would be bound with "
                    "one fixed key on a direct exchange: most messages would not reach it",
                    hint="Set BINDING_KEY (with a topic exchange, e.g. 'orders.#'), or drop "
                    "QUEUE and bind your queues yourself.",
                    id="django_outbox.E015",
                )
            )
        if scheme in REDIS_SCHEMES:
            try:
                import redis  # noqa: F401
            except ImportError:
                problems.append(
                    checks.Error(
                        f"destination {destination.name!r}: the redis package is not installed",
                        hint='pip install "django-outbox-inbox[redis]"',
                        id="django_outbox.E016",
                    )
                )
            if destination.options.get("exchange"):
                problems.append(
                    checks.Error(
                        f"destination {destination.name!r}: Redis destinations publish straight "
                        "to a queue; EXCHANGE is not supported",
                        hint="Set QUEUE instead.",
                        id="django_outbox.E012",
                    )
                )
            if not destination.options.get("queue"):
                problems.append(
                    checks.Error(
                        f"destination {destination.name!r}: QUEUE is required for Redis",
                        id="django_outbox.E013",
                    )
                )
        return problems

    def publish(self, envelopes: Sequence[Envelope], deadline: float | None = None) -> Outcomes:
        # One pipelined batch: it either completes within TIMEOUT or fails.
        return self._publisher.publish(envelopes)

    def hand_over(self, envelopes: Sequence[Envelope], deadline: float | None = None) -> Any:
        publisher = self._publisher
        if isinstance(publisher, _AmqpPublisher):
            return publisher.hand_over(envelopes)
        return super().hand_over(envelopes, deadline)

    def collect(self, handed: Any) -> Outcomes:
        publisher = self._publisher
        if isinstance(handed, _Handed) and isinstance(publisher, _AmqpPublisher):
            return publisher.collect(handed)
        return super().collect(handed)

    def close(self) -> None:
        self._publisher.close()


def _has_placeholders(pattern: str | None) -> bool:
    return bool(pattern) and ("{type}" in str(pattern) or "{key}" in str(pattern))


def binding_key(options: Any) -> str | None:
    """The key ``QUEUE`` is bound with: ``BINDING_KEY``, else a routing key
    without placeholders, else the queue's name."""
    routing_key = options.get("routing_key")
    if options.get("binding_key"):
        return str(options["binding_key"])
    if routing_key and not _has_placeholders(routing_key):
        return str(routing_key)
    queue = options.get("queue")
    return str(queue) if queue else None


class _Publisher:
    def __init__(self, options: Any) -> None:
        self.url = str(options["url"])
        self.safe_url = maybe_sanitize_url(self.url)  # for logs: no password
        self.timeout = float(options.get("timeout", 10.0))
        self.queue_name: str | None = options.get("queue")
        self.routing_key: str | None = options.get("routing_key")
        #: What a message's routing key is made from: ``{type}`` and ``{key}`` filled in.
        self.route_pattern: str = self.routing_key or self.queue_name or "{type}"
        self.binding_key = binding_key(options)
        self.exchange = kombu.Exchange(
            options.get("exchange", ""), type=options.get("exchange_type", "direct"), durable=True
        )

    def publish_arguments(self, envelope: Envelope) -> dict[str, Any]:
        """``Producer.publish`` arguments for *envelope*: persistent JSON with its ids."""
        message_id = str(envelope.message_id)
        return {
            "routing_key": self.route(envelope),
            "content_type": "application/json",
            "content_encoding": "utf-8",
            "headers": envelope.headers,
            "delivery_mode": 2,
            "message_id": message_id,
            "correlation_id": envelope.correlation_id or message_id,
            "type": envelope.type,
            "retry": False,
        }

    def route(self, envelope: Envelope) -> str:
        pattern = self.route_pattern
        return pattern.replace("{type}", envelope.type).replace("{key}", envelope.key or "")

    def publish(self, envelopes: Sequence[Envelope]) -> Outcomes:
        raise NotImplementedError

    def close(self) -> None:
        pass


@dataclass(eq=False)
class _Handed:
    """Messages handed to RabbitMQ by one ``hand_over``: their outcomes as the
    confirms come in, and the delivery tag of the last one (0: none is unconfirmed)."""

    envelopes: Sequence[Envelope]
    outcomes: Outcomes = field(default_factory=dict)
    last_tag: int = 0


class _AmqpPublisher(_Publisher):
    """Batched publish with one wait for all publisher confirms; the wait may come
    after the next batch was handed over (``hand_over``, then ``collect``)."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.confirm = bool(options.get("confirm", True))
        self._connection: kombu.Connection | None = None
        self._producer: kombu.Producer | None = None
        self._next_tag = 1
        #: Unconfirmed messages by delivery tag (increasing), of every batch handed over.
        self._pending: dict[int, tuple[UUID, _Handed]] = {}
        self._returned: dict[str, str] = {}

    def _connect(self) -> kombu.Producer:
        if self._producer is not None:
            return self._producer
        connection = kombu.Connection(self.url, connect_timeout=self.timeout)
        try:
            connection.connect()
            channel: Any = connection.channel()  # py-amqp's Channel: confirms and events
            if self.confirm:
                channel.confirm_select()
                channel.events["basic_ack"].add(self._on_ack)
                channel.events["basic_nack"].add(self._on_nack)
                # Mandatory publishes that no queue takes come back before
                # their confirm: without this, RabbitMQ confirms and drops them.
                channel.events["basic_return"].add(self._on_return)
            if self.exchange.name:
                self.exchange(channel).declare()
            if self.queue_name:
                kombu.Queue(
                    self.queue_name, self.exchange, routing_key=self.binding_key or "", durable=True
                )(channel).declare()
        except BaseException:
            connection.release()
            raise
        self._connection = connection
        self._producer = kombu.Producer(channel, exchange=self.exchange)
        self._next_tag = 1
        return self._producer

    def _settle(self, tag: int, multiple: bool, error: RetryableError | None) -> None:
        # Tags were added in increasing order: the settled ones lead the dict, so a
        # multiple ack's walk stops at the first one beyond *tag* (not the whole batch).
        tags = list(itertools.takewhile(tag.__ge__, self._pending)) if multiple else [tag]
        for settled in tags:
            entry = self._pending.pop(settled, None)
            if entry is not None:
                message_id, handed = entry
                returned = self._returned.pop(str(message_id), None)
                handed.outcomes[message_id] = RetryableError(returned) if returned else error

    def _on_return(self, exc: Any, exchange: str, routing_key: str, message: Any) -> None:
        message_id = (getattr(message, "properties", None) or {}).get("message_id")
        if message_id:
            where = f"exchange {exchange!r}" if exchange else "the default exchange"
            self._returned[str(message_id)] = (
                f"unroutable: no queue is bound on {where} for routing key {routing_key!r}"
            )

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(delivery_tag, multiple, None)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(delivery_tag, multiple, RetryableError("RabbitMQ nacked the message"))

    def publish(self, envelopes: Sequence[Envelope]) -> Outcomes:
        """Publish the batch, then wait once for the confirms (see ``hand_over``)."""
        return self.collect(self.hand_over(envelopes))

    def hand_over(self, envelopes: Sequence[Envelope]) -> _Handed:
        """Publish the batch; ``collect`` waits for its confirms.

        At most one message per key is unconfirmed at a time: before the next
        message of a key goes out, the confirms in flight are awaited, and if
        the earlier one was nacked or returned the rest of its key stays
        unattempted. So a key is never reordered by a failure, while a batch
        of distinct keys still costs one confirm wait.
        """
        handed = _Handed(envelopes)
        sent: set[UUID] = set()
        in_flight: dict[str, UUID] = {}  # key -> its unconfirmed message
        connecting = True
        try:
            producer = self._connect()
            connecting = False
            for envelope in envelopes:
                key = envelope.key
                if self.confirm and key is not None and key in in_flight:
                    self._await_confirms(self._next_tag - 1)
                    in_flight.clear()
                if key is not None and self._key_failed(key, handed):
                    continue
                producer.publish(
                    envelope.body(), mandatory=self.confirm, **self.publish_arguments(envelope)
                )
                sent.add(envelope.message_id)
                if self.confirm:
                    handed.last_tag = self._next_tag
                    self._pending[self._next_tag] = (envelope.message_id, handed)
                    self._next_tag += 1
                    if key is not None:
                        in_flight[key] = envelope.message_id
                else:
                    handed.outcomes[envelope.message_id] = None
        except Exception as exc:
            self._failed(exc, connecting=connecting)
            error, unknown = self._errors(exc, connecting)
            for envelope in envelopes:
                # Confirmed before the failure: those did reach the broker.
                # Handed over but unconfirmed: they may have.
                lost = unknown if envelope.message_id in sent else error
                handed.outcomes.setdefault(envelope.message_id, lost)
        return handed

    def collect(self, handed: _Handed) -> Outcomes:
        """Wait for the confirms of what *handed* published; its outcomes. A message
        the batch left unattempted (behind a failed one of its key) has none."""
        try:
            self._await_confirms(handed.last_tag)
        except Exception as exc:
            self._failed(exc, connecting=False)
        return handed.outcomes

    def _failed(self, exc: Exception, *, connecting: bool) -> None:
        """The connection failed: close it, and every message handed over and not
        confirmed, in any batch still waiting, may or may not have arrived."""
        logger.warning("AMQP publish to %s failed: %s", self.safe_url, exc)
        self.close(broken=True)
        _, unknown = self._errors(exc, connecting)
        pending, self._pending = self._pending, {}
        for message_id, handed in pending.values():
            handed.outcomes[message_id] = unknown
        self._returned.clear()

    @staticmethod
    def _errors(exc: Exception, connecting: bool) -> tuple[DeliveryError, DeliveryError]:
        """What *exc* means for a message not handed over, and for one handed over and
        not confirmed."""
        error: DeliveryError = _error(exc)
        unknown: DeliveryError = UncertainError(f"no publisher confirm before the failure: {error}")
        if _connection_level(exc) or (connecting and isinstance(exc, TimeoutError)):
            # The broker is away: the destination's circuit opens. What was not
            # handed over certainly did not arrive.
            error = UnreachableError(_text(exc))
            unknown = ConnectionLostError(f"no publisher confirm before the failure: {error}")
        return error, unknown

    def _key_failed(self, key: str, handed: _Handed) -> bool:
        """Whether an earlier message of *key* in this batch was nacked or returned."""
        outcomes = handed.outcomes
        return any(
            e.key == key and outcomes.get(e.message_id) is not None
            for e in handed.envelopes
            if e.message_id in outcomes
        )

    def _await_confirms(self, last_tag: int) -> None:
        """Wait until every message up to delivery tag *last_tag* is confirmed."""
        deadline = time.monotonic() + self.timeout
        pending = self._pending
        while pending and next(iter(pending)) <= last_tag:
            assert self._connection is not None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                waiting = sum(1 for tag in pending if tag <= last_tag)
                raise TimeoutError(f"{waiting} publisher confirms not received in time")
            try:
                self._connection.drain_events(timeout=remaining)
            except TimeoutError:
                continue

    def close(self, *, broken: bool = False) -> None:
        """Close the connection: politely, or, when it is *broken*, without a word to
        the broker (a polite close waits for an answer that may never come)."""
        connection, self._connection, self._producer = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):  # the connection may already be dead
                if broken:
                    connection.collect()
                else:
                    connection.release()


class _RedisPublisher(_Publisher):
    """One LPUSH per batch, in the message format of kombu's Redis transport."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        import redis  # optional dependency: django-outbox-inbox[redis]

        self._redis = redis
        self.client = redis.Redis.from_url(
            self.url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout
        )
        self._tag_prefix = uuid.uuid4().hex
        self._tags = itertools.count()
        #: The routing key as JSON text when it is the same for every message.
        self._fixed_route = (
            None if _has_placeholders(self.route_pattern) else quote(self.route_pattern)
        )

    def encode(self, envelope: Envelope) -> str:
        """The message as kombu's Redis transport stores it: JSON text, written here
        piece by piece (each string quoted by the json module's own C function), since
        ``json.dumps`` of the nested dict cost 13 µs a message, the most of anything
        on the relay's path, and the text is the same JSON.

        The body travels as JSON text with no body_encoding, which kombu's Redis
        channel reads as-is: no base64 round trip on either side. The delivery tag is
        unique per publish (kombu tracks unacked deliveries by tag): a random prefix
        per publisher and a counter, no system call per message."""
        message_id = envelope.id_text()
        return (
            f'{{"body":{quote(envelope.body_text())},"content-encoding":"utf-8",'
            f'"content-type":"application/json","headers":{envelope.headers_json()},'
            f'"properties":{{'
            f'"delivery_tag":"{self._tag_prefix}.{next(self._tags)}","delivery_mode":2,'
            f'"priority":0,"message_id":"{message_id}",'
            f'"correlation_id":{quote(envelope.correlation_id or message_id)},'
            f'"type":{quote(envelope.type)},"delivery_info":{{"exchange":"",'
            f'"routing_key":{self._fixed_route or quote(self.route(envelope))}}}}}}}'
        )

    def publish(self, envelopes: Sequence[Envelope]) -> Outcomes:
        if not envelopes:
            return {}
        assert self.queue_name is not None
        outcomes: Outcomes = {}
        encoded, good = [], []
        for envelope in envelopes:
            try:
                encoded.append(self.encode(envelope).encode("utf-8"))
                good.append(envelope)
            except (UnicodeError, TypeError, ValueError) as exc:
                outcomes[envelope.message_id] = PermanentError(f"cannot encode: {exc}")
        if not encoded:
            return outcomes
        try:
            # LPUSH pushes each value to the head in turn; consumers BRPOP from
            # the tail, so the first envelope is the first one read.
            self.client.lpush(self.queue_name, *encoded)
        except self._redis.RedisError as exc:
            logger.warning("Redis publish to %s failed: %s", self.safe_url, exc)
            error = _error(exc)
            if _may_have_arrived(exc, self._redis):
                # The LPUSH was sent; whether Redis applied it is unknown.
                if isinstance(exc, self._redis.ConnectionError):
                    error = ConnectionLostError(str(error))  # and Redis went away
                else:
                    error = UncertainError(str(error))
            elif isinstance(exc, (self._redis.ConnectionError, self._redis.TimeoutError)):
                error = UnreachableError(str(error))  # could not connect: nothing was sent
            outcomes.update((e.message_id, error) for e in good)
            return outcomes
        outcomes.update((e.message_id, None) for e in good)
        return outcomes

    def close(self) -> None:
        self.client.close()


def _may_have_arrived(exc: Exception, redis: Any) -> bool:
    """Whether a Redis error came after the command was written: a timeout, or a
    connection lost while waiting for the reply (not a refused or failed connect)."""
    if isinstance(exc, redis.AuthenticationError):
        return False  # refused at login: nothing was written
    if "connecting to" in str(exc):
        return False  # "Error/Timeout connecting to host:port": nothing was written
    return isinstance(exc, (redis.TimeoutError, redis.ConnectionError))


class _ProducerPublisher(_Publisher):
    """Plain kombu ``Producer.publish``, one message at a time."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.transport_options = dict(options.get("transport_options") or {})
        self._connection: kombu.Connection | None = None

    def publish(self, envelopes: Sequence[Envelope]) -> Outcomes:
        outcomes: Outcomes = {}
        in_flight: Envelope | None = None
        try:
            if self._connection is None:
                self._connection = kombu.Connection(
                    self.url, transport_options=self.transport_options
                )
            producer = self._connection.Producer(exchange=self.exchange)
            declare = (
                [kombu.Queue(self.queue_name, self.exchange, routing_key=self.binding_key or "")]
                if self.queue_name
                else []
            )
            for envelope in envelopes:
                in_flight = envelope
                producer.publish(
                    envelope.body(), declare=declare, **self.publish_arguments(envelope)
                )
                outcomes[envelope.message_id] = None
                in_flight = None
        except Exception as exc:
            logger.warning("kombu publish to %s failed: %s", self.safe_url, exc)
            self.close()
            error = _error(exc)
            if in_flight is not None:
                # It was being written when the error came: it may have arrived.
                outcomes[in_flight.message_id] = UncertainError(str(error))
            for envelope in envelopes:
                outcomes.setdefault(envelope.message_id, error)
        return outcomes

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.release()
