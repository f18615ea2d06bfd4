"""The kombu consumer behind ``manage.py inbox_consume``: RabbitMQ or Redis queues into
the inbox, acknowledged only once stored.

Messages are taken in batches (``--batch`` messages, or what arrived within
``--batch-seconds``): one transaction stores the whole batch, and only after
it commits are the messages acknowledged. A database failure acknowledges
nothing (the messages are returned to the queue and come again); a crash
after the commit and before the acks redelivers messages that are already
stored, and the inbox recognises them (same source and message id).

By default the consumer also handles the batch in that same transaction
(lock mode without a claim: rows the transaction inserted are its own until
it commits), so a batch costs one commit, and a crash anywhere before it
rolls back the rows with the handlers' effects: the broker redelivers them.
With ``--no-handle`` it only stores, and triggers the handlers as
``DISPATCH`` says.

A message whose values the database refuses does not hold back its batch: the
batch is stored again one message at a time, and the refused one is kept as
``handle_error`` (see ``intake``).

A lost broker connection is made again, with backoff (``outage``); the
messages in hand, never acknowledged, come again from the broker and are
recognised. The consumer gives up (``SourceUnavailable``) once the broker has
been unreachable for ``max_outage`` seconds, or at once when the broker
refuses it for a reason reconnecting cannot fix.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import kombu
import kombu.exceptions
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction

from django_outbox import metrics, signals, tracing
from django_outbox.conf import Source
from django_outbox.engine import faults, sweeps, triggers
from django_outbox.engine.retry import retry_transient
from django_outbox.inbox.consumers.amqp import buffered_transport
from django_outbox.inbox.consumers.outage import Outage, SourceUnavailable
from django_outbox.inbox.handling import Handling, Inbox, store_and_handle
from django_outbox.inbox.intake import (
    REFUSED,
    Arrival,
    Stored,
    ordered_envelopes,
    store_each,
    store_many,
)

logger = logging.getLogger("django_outbox.inbox")

#: AMQP heartbeat (seconds) unless the source sets ``HEARTBEAT`` (0: none). Two
#: missed heartbeats of the broker's mean the link is dead: the consumer reconnects.
DEFAULT_HEARTBEAT_SECONDS = 60.0
#: AMQP: the longest wait for one reply of the broker (``read_timeout``) or one
#: write (``write_timeout``), unless the source's ``TRANSPORT_OPTIONS`` set them.
AMQP_SOCKET_TIMEOUT_SECONDS = 30.0


def heartbeat_tick_seconds(heartbeat: float) -> float:
    """How often the consumer checks AMQP heartbeats: about once a second, as kombu
    asks, and at least four times a heartbeat interval when that is shorter."""
    if heartbeat <= 0:
        return 1.0
    return min(1.0, heartbeat / 4)


@dataclass
class ConsumeResult:
    """Counts of a consumer's run."""

    received: int = 0
    stored: int = 0
    duplicates: int = 0
    unreadable: int = 0
    handled: int = 0
    failed_batches: int = 0
    #: Messages the database refused even as unreadable: rejected, logged at ERROR.
    refused: int = 0
    batches: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class KombuConsumer:
    """Consumes one kombu source until told to stop."""

    source: Source
    using: str = DEFAULT_DB_ALIAS
    batch_size: int = 500
    batch_seconds: float = 0.05
    handle: bool = True
    #: When idle, handle what is due every this many seconds.
    drain_interval: float = 1.0
    stop_event: threading.Event = field(default_factory=threading.Event)
    result: ConsumeResult = field(default_factory=ConsumeResult)

    #: Give up once the broker has been unreachable this long (seconds; 0: at the
    #: first failure).
    max_outage: float = 300.0

    def __post_init__(self) -> None:
        self._next_mark = 0.0
        self._pending: list[Any] = []
        self._multiple_ack = False
        #: The broker outage under way, if any.
        self._outage: Outage | None = None
        self._drain_failing = False

    def stop(self, *args: Any) -> None:
        """Finish the batch in hand, then return from ``run()`` (a signal handler)."""
        self.stop_event.set()

    def run(self, *, until_idle: float | None = None, max_messages: int | None = None) -> None:
        """Consume until stopped, until no message came for *until_idle* seconds, or
        after *max_messages* messages.

        Reconnects when the broker connection is lost or cannot be made; raises
        ``SourceUnavailable`` when that lasted ``max_outage`` seconds, or when the
        broker refused the consumer (credentials, a queue declared differently).
        """
        connection = self._connection()
        try:
            while not self.stop_event.is_set():
                connected = False
                try:
                    # One try: the waiting between tries is ours (see _wait_out).
                    connection.ensure_connection(max_retries=0, reraise_as_library_errors=False)
                    connected = True
                    self._consume(connection, until_idle=until_idle, max_messages=max_messages)
                    return
                except Exception as exc:
                    if not self._recoverable(connection, exc):
                        raise
                    # Never acknowledged: the broker gives them to a consumer again.
                    self._pending = []
                    url = connection.as_uri()
                    self._forget(connection)
                    if self.stop_event.is_set():
                        return
                    self._outage = self._wait_out(exc, url=url, connected=connected)
                    connection.maybe_switch_next()  # the next of a failover URL's hosts
        finally:
            with contextlib.suppress(Exception):  # it may be gone already
                connection.release()
            connections[self.using].close()

    def _connection(self) -> kombu.Connection:
        options = self.source.options
        url = str(options["url"])
        transport_options = dict(options.get("transport_options") or {})
        if kombu.Connection(url).transport.driver_type == "amqp":
            # A reply that never comes (closing a connection that went silent) must
            # not hold the consumer, and its SIGTERM, forever.
            for name in ("read_timeout", "write_timeout"):
                transport_options.setdefault(name, AMQP_SOCKET_TIMEOUT_SECONDS)
        return kombu.Connection(
            url,
            heartbeat=float(options.get("heartbeat", DEFAULT_HEARTBEAT_SECONDS)),
            transport_options=transport_options,
            # Plain AMQP: frames read from the socket in large pieces (see .amqp).
            transport=buffered_transport(url),
        )

    def _recoverable(self, connection: kombu.Connection, exc: Exception) -> bool:
        """Whether reconnecting may cure *exc*: ``True`` for a lost or refused connection,
        raises ``SourceUnavailable`` for the broker's other refusals, and ``False`` for
        what is not the broker's (a bug: the caller lets it through)."""
        recoverable = (
            *connection.recoverable_connection_errors,
            *connection.recoverable_channel_errors,
            kombu.exceptions.OperationalError,  # kombu's wrapper of the ones above
        )
        if isinstance(exc, recoverable):
            return True
        if isinstance(exc, (*connection.connection_errors, *connection.channel_errors)):
            raise SourceUnavailable(
                f"inbox source {self.source.name!r}: {connection.as_uri()} refused the consumer "
                f"({type(exc).__name__}: {exc}); reconnecting cannot fix this"
            ) from exc
        return False

    def _wait_out(self, exc: Exception, *, url: str, connected: bool) -> Outage:
        """Count a failed try of the outage (begun now if none is under way) and sleep
        until the next; raise ``SourceUnavailable`` when the time allowed is spent."""
        now = time.monotonic()
        error = f"{type(exc).__name__}: {exc}"
        outage = self._outage
        if outage is None:
            outage = Outage(began=now, max_seconds=self.max_outage)
            if self.max_outage > 0:
                # One line per outage, not one per try.
                logger.warning(
                    "inbox source %r: %s %s (%s); reconnecting for up to %g s",
                    self.source.name,
                    "lost its connection to" if connected else "cannot connect to",
                    url,
                    error,
                    self.max_outage,
                )
        pause = outage.next_pause(now)
        if pause is None:
            raise SourceUnavailable(
                f"inbox source {self.source.name!r}: gave up after {outage.lasted(now):.0f} s "
                f"without a connection to {url} ({error}; --max-outage {self.max_outage:g})"
            ) from exc
        self.stop_event.wait(pause)
        return outage

    def _forget(self, connection: kombu.Connection) -> None:
        """Drop a lost connection's socket and channels without waiting on the broker."""
        try:
            connection.collect(socket_timeout=1.0)
        except Exception:  # it is gone either way
            logger.debug("closing the connection of %s failed", self.source.name, exc_info=True)

    def _consume(
        self, connection: kombu.Connection, *, until_idle: float | None, max_messages: int | None
    ) -> None:
        """Consume on *connection* until stopped, idle or done; broker errors propagate."""
        options = self.source.options
        prefetch = int(options.get("prefetch") or self.batch_size * 2)
        queue = kombu.Queue(str(options["queue"]), durable=True)
        self._multiple_ack = connection.transport.driver_type == "amqp"
        consumer = connection.Consumer(
            [queue], on_message=self._on_message, prefetch_count=prefetch
        )
        consumer.consume()
        if self._outage is not None:
            # Said once the subscription works (a Redis connection is made lazily).
            logger.info(
                "inbox source %r: connected to %s again after %.1f s (%d failed tr%s)",
                self.source.name,
                connection.as_uri(),
                self._outage.lasted(time.monotonic()),
                self._outage.failures,
                "y" if self._outage.failures == 1 else "ies",
            )
            self._outage = None
        idle_since = time.monotonic()
        tick = heartbeat_tick_seconds(float(connection.heartbeat or 0))
        next_tick = 0.0
        batch_started: float | None = None
        last_drain = 0.0
        while not self.stop_event.is_set():
            # With messages in hand, wait only a moment for more: a batch is
            # flushed as soon as the socket is drained (low latency when
            # quiet), or when full or old (large batches under load).
            got = True
            try:
                connection.drain_events(timeout=self.batch_seconds if self._pending else 0.2)
            except TimeoutError:
                got = False
            now = time.monotonic()
            if now >= next_tick:
                # Sends ours when due; raises when the broker's are overdue (a silent
                # link). Not on every message: each check costs a few log calls.
                connection.heartbeat_check()
                next_tick = now + tick
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
                # Idle: handle what is due from elsewhere (retries that came
                # due, messages of a consumer that died mid-handling).
                self._drain_due()
                last_drain = now
            if max_messages is not None and self.result.received >= max_messages:
                break
            if until_idle is not None and now - idle_since >= until_idle:
                break
        # No basic.cancel: closing the connection ends the subscription without
        # waiting for an answer that a broken link would never bring.
        self.flush()

    def _drain_due(self) -> None:
        try:
            if time.monotonic() >= self._next_mark:
                # This consumer handles what is due: it is the inbox's sweep too, and
                # says so (no "no sweep" warning where it runs alone).
                sweeps.rescue_stuck(Handling(using=self.using))
                self._next_mark = time.monotonic() + 10.0
            self.result.handled += Inbox(using=self.using).drain().done
        except DatabaseError as exc:
            # The next batch meets the same database and gives its messages back.
            if not self._drain_failing:  # once until a drain works again
                logger.warning(
                    "inbox source %r: handling due messages failed (%s: %s); trying again "
                    "every %g s",
                    self.source.name,
                    type(exc).__name__,
                    str(exc).strip(),
                    self.drain_interval,
                )
            self._drain_failing = True
            connections[self.using].close()
        else:
            self._drain_failing = False

    def _on_message(self, message: Any) -> None:
        self._pending.append(message)

    def flush(self) -> None:
        """Store the pending messages and handle them in one transaction, then ack them."""
        batch, self._pending = self._pending, []
        if not batch:
            return
        self.result.received += len(batch)
        arrivals = [self._arrival(m) for m in batch]
        handle = self.handle
        # A redelivered batch may be one whose handler killed the consumer: store it
        # first (committed), then handle it through claims that count each attempt
        # before it runs, so a poison message uses up its attempts and is parked
        # instead of killing every consumer that receives it again.
        redelivered = any(
            (getattr(m, "delivery_info", None) or {}).get("redelivered") for m in batch
        )
        handle_later = handle and redelivered
        if handle_later:
            handle = False
        try:
            # A deadlock or a lost connection rolled everything back: the messages
            # are still in hand, unacknowledged, so the batch can simply go again.
            stored, handled, woken = retry_transient(
                lambda: self._store(arrivals, handle=handle),
                what=f"storing a batch from {self.source.name}",
                reconnect=self.using,
            )
        except DatabaseError:
            # Nothing was stored: give every message back to the broker.
            logger.exception(
                "storing %d message(s) from %s failed; they go back to the queue",
                len(batch),
                self.source.name,
            )
            self.result.failed_batches += 1
            self._give_back(batch)
            connections[self.using].close()
            time.sleep(1.0)
            return
        self.result.stored += len(stored.rows)
        self.result.duplicates += stored.duplicates
        self.result.unreadable += stored.unreadable
        self.result.handled += handled
        metrics.counted("inbox", "received", self.source.name, len(stored.rows) + stored.unreadable)
        metrics.counted("inbox", "duplicates", self.source.name, stored.duplicates)
        signals.emit(
            signals.inbox_batch_stored,
            sender=KombuConsumer,
            source=self.source.name,
            ids=stored.ids,
        )
        for position, refused in stored.refused.items():
            # Retrying it would fail again, forever: give it up, said loudly.
            logger.error(
                "%s; rejected (dead-lettered if the queue has a dead-letter exchange, "
                "else dropped)",
                refused,
            )
            self.result.refused += 1
            self._reject(batch[position])
        faults.point("inbox.before_ack")  # committed (stored, handled), not acknowledged
        self._ack([m for n, m in enumerate(batch) if n not in stored.refused])
        self.result.batches += 1
        if handle_later and stored.rows:
            try:
                self.result.handled += Inbox(using=self.using).deliver(stored.ids).done
            except DatabaseError:
                # Stored and acknowledged: the idle drains (or another worker) handle them.
                logger.warning(
                    "inbox source %r: handling a redelivered batch failed; it is stored, and "
                    "handled when the database answers again",
                    self.source.name,
                    exc_info=True,
                )
                connections[self.using].close()
        if woken:
            # Handling made messages of strict keys due (stored earlier, waiting for
            # a predecessor that came in this batch): handle them now.
            self.result.handled += Inbox(using=self.using).drain().done

    def _store(self, arrivals: list[Arrival], *, handle: bool) -> tuple[Stored, int, bool]:
        """Store *arrivals* in one statement; if the database refuses a value of the
        batch, one by one (so the message at fault is kept as unreadable, and the
        others are stored as usual)."""
        with tracing.receiving(self.source, arrivals):  # a "receive" span when tracing is on
            try:
                return self._store_with(store_many, arrivals, handle=handle)
            except REFUSED as exc:
                logger.warning(
                    "the database refused a batch of %d message(s) from %s (%s: %s); storing "
                    "them one by one",
                    len(arrivals),
                    self.source.name,
                    type(exc).__name__,
                    str(exc).splitlines()[0] if str(exc) else "",
                )
                return self._store_with(store_each, arrivals, handle=handle)

    def _store_with(
        self, storer: Callable[..., Stored], arrivals: Sequence[Arrival], *, handle: bool
    ) -> tuple[Stored, int, bool]:
        """Store *arrivals* with *storer* in one transaction and, with *handle*, handle
        the new ones in it (``handling.store_and_handle``: a crash rolls back rows and
        effects together, and the broker, not yet acknowledged, delivers them again).
        Returns what was stored, how many were handled, and whether handling made other
        messages of strict keys due."""
        if handle:
            return store_and_handle(
                self.using,
                ordered_envelopes(arrivals),
                lambda: storer(arrivals, using=self.using),
                rows=operator.attrgetter("rows"),
            )
        with transaction.atomic(using=self.using):
            stored = storer(arrivals, using=self.using)
        if stored.rows and not self.handle:
            # Nobody here handles them: wake the handlers as DISPATCH says.
            triggers.dispatch("inbox", self.using, stored.ids)
        return stored, 0, False

    def _give_back(self, batch: list[Any]) -> None:
        """Return *batch*, never stored, to the queue."""
        for message in batch:
            try:
                message.requeue()
            except Exception:  # the connection may be gone: the broker redelivers
                logger.debug("requeue failed", exc_info=True)

    def _reject(self, message: Any) -> None:
        """Give up *message*, which the database refused even as unreadable."""
        message.reject(requeue=False)

    def _ack(self, batch: list[Any]) -> None:
        """Acknowledge *batch*: on AMQP with one frame (``multiple``: every delivery up to
        the last of the batch, all of them in it), elsewhere message by message."""
        if not batch:
            return
        if self._multiple_ack:
            batch[-1].ack(multiple=True)
            return
        for message in batch:
            message.ack()

    def _arrival(self, message: Any) -> Arrival:
        body = message.body
        if isinstance(body, str):
            body = body.encode("utf-8")
        properties = message.properties or {}
        return Arrival(
            source=self.source,
            body=body,
            headers=message.headers or {},
            transport_id=properties.get("message_id"),
            content_type=message.content_type,
        )
