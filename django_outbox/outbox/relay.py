"""The relay: the outbox's step for the engine, publishing a batch per destination.

Everything about leases, fencing, backoff, dead-lettering, draining and
rescue is the engine's (``django_outbox.engine``). What is the outbox's own
is here: which messages are due (per-key order over destination and key),
how a batch is published (one transport call per destination, outcomes
recorded destination by destination as they come back), the per-destination
attempt limits and "hold" policy, and the outbox's signals and log lines.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django_outbox import signals, tracing
from django_outbox.engine import clock, faults, ordering, triggers
from django_outbox.engine.outcomes import (
    WAITING,
    Defer,
    Outcome,
    Outcomes,
    Retry,
    Uncertain,
    from_error,
)
from django_outbox.engine.part import Attempt, KeyOrdering, Lifecycle, Part, register
from django_outbox.engine.runner import Runner, RunResult
from django_outbox.engine.sweeps import RescueResult
from django_outbox.exceptions import (
    ConfigurationError,
    DestinationDown,
    UncertainError,
    UnknownDestination,
    UnreachableError,
)
from django_outbox.outbox.circuits import Gate, circuits
from django_outbox.outbox.envelope import Envelope
from django_outbox.outbox.models import UNFINISHED_STATES, OutboxKey, OutboxMessage, OutboxState
from django_outbox.outbox.transports.base import Transport
from django_outbox.outbox.transports.registry import get_transport

#: Columns a claim reads back: what envelopes, outcomes and signals need.
CLAIMED_FIELDS = (
    "id",
    "message_id",
    "type",
    "destination",
    "payload",
    "headers",
    "key",
    "sequence",
    "correlation_id",
    "attempts",
    "created_at",
    "blocking",
    "attempt_open",
    "unclean_end",
)

#: The Celery task an on-commit trigger of the outbox sends.
DELIVER_TASK = "django_outbox.tasks.deliver_messages"


@dataclass
class RelayResult(RunResult):
    """Counts of relay cycles; ``sent`` is the engine's ``done``."""

    @property
    def sent(self) -> int:
        return self.done

    def as_dict(self) -> dict[str, int]:
        counts = super().as_dict()
        counts["sent"] = counts.pop("done")
        return counts


@register
class Publishing(Part):
    """The outbox part: outgoing messages published through their destination's transport."""

    name = "outbox"
    sweepers = (
        "Celery beat's django_outbox.sweep_outbox (the documented schedule), or outbox_relay, or "
        "outbox_sweep from cron"
    )
    model = OutboxMessage
    lifecycle = Lifecycle(
        ready=OutboxState.SHOULD_BE_SENT,
        running=OutboxState.SENDING,
        done=OutboxState.SENT,
        failed=OutboxState.SEND_ERROR,
        finished=(OutboxState.SENT, OutboxState.CANCELLED),
    )
    claimed_fields = CLAIMED_FIELDS
    ordering = KeyOrdering(
        key_fields=("destination", "key"),
        sequence_field="sequence",
        blocking_states=UNFINISHED_STATES,
        counter=OutboxKey,
    )

    def process(self, rows: Sequence[Any], attempt: Attempt) -> Iterator[Outcomes]:
        """Publish per destination; yield each chunk's outcomes as soon as it returns.

        A chunk's attempt is declared just before it is published: rows the relay
        never reached are given back uncounted. A message that ended its last attempt
        with its relay dying is published alone (a message that kills its relay
        cannot take others with it).
        """
        by_destination: dict[str, list[OutboxMessage]] = defaultdict(list)
        for row in rows:
            by_destination[row.destination].append(row)
        for destination, messages in by_destination.items():
            messages.sort(key=_publish_order)
            try:
                transport = get_transport(self.settings.outbox.destination(destination))
            except (UnknownDestination, ConfigurationError) as exc:
                # Another process accepted it in send(): during a rolling deploy an
                # older relay may not know a new destination yet. Retry, do not bury.
                yield self._failed(attempt, messages, Retry(str(exc)))
                continue
            except Exception as exc:  # building the transport failed: nothing was sent
                self.logger.exception("cannot build the transport of %r", destination)
                error = Retry(f"transport unavailable: {type(exc).__name__}: {exc}")
                yield self._failed(attempt, messages, error)
                continue
            yield from self._destination(destination, transport, messages, attempt)

    def _destination(
        self,
        destination: str,
        transport: Transport,
        messages: list[OutboxMessage],
        attempt: Attempt,
    ) -> Iterator[Outcomes]:
        """Publish one destination's messages chunk by chunk, through its circuit
        (``outbox.circuits``): none while it is open, one alone while probing."""
        breaker = self.settings.outbox.circuit_breaker
        gate = circuits.allow(destination) if breaker else Gate.SEND
        if gate is Gate.WAIT:
            return  # given back unattempted: the destination is down or being probed
        size = transport.chunk_size or len(messages)
        chunks = _chunks(messages, size)
        if gate is Gate.PROBE:
            probe = _probe(messages, circuits.probes(destination))
            rest = [m for m in messages if m is not probe]
            chunks = itertools.chain([[probe]], _chunks(rest, size))
        # RabbitMQ with confirms: hand the chunk over, let the engine run the next batch,
        # then wait for the confirms.
        overlap = transport.overlaps
        try:
            failed_keys: set[str] = set()
            for chunk in chunks:
                # A message behind a failed one of its key stays unattempted.
                chunk = [m for m in chunk if m.key not in failed_keys]
                if not chunk or time.monotonic() >= attempt.deadline:
                    # An earlier destination of this batch used up the lease: leave
                    # these unattempted rather than publish after the lease ran out.
                    continue
                chunk = attempt.start(chunk)
                if not chunk:
                    continue
                faults.point("outbox.before_publish")
                if overlap:
                    collect = self._hand_over(transport, destination, chunk, attempt.deadline)
                    yield WAITING
                    published = collect()
                else:
                    published = self._publish(transport, destination, chunk, attempt.deadline)
                signals.emit(
                    signals.outbox_batch_published,
                    Relay,
                    destination=destination,
                    messages=chunk,
                    outcomes=published,
                )
                failed_keys.update(
                    m.key for m in chunk if m.key is not None and published.get(m.message_id, 1)
                )
                down = [e for e in published.values() if isinstance(e, DestinationDown)]
                if breaker and down:
                    circuits.failed(destination, str(down[0]))
                elif breaker and published:
                    circuits.succeeded(destination)
                yield {
                    m.pk: _outcome(published[m.message_id], breaker)
                    for m in chunk
                    if m.message_id in published
                }
                if breaker and down:
                    break  # the rest goes back unattempted, to wait for the circuit
        finally:
            if gate is Gate.PROBE:
                # A probe that got no answer either way (out of time, stopped) must
                # not leave the circuit probing: the next claim probes again.
                circuits.abandoned(destination)

    @staticmethod
    def _failed(attempt: Attempt, messages: list[OutboxMessage], outcome: Any) -> Outcomes:
        """The same failed outcome for *messages*, their attempt counted."""
        return dict.fromkeys((m.pk for m in attempt.start(messages)), outcome)

    def _publish(
        self,
        transport: Transport,
        destination: str,
        messages: Sequence[OutboxMessage],
        deadline: float,
    ) -> dict[Any, Any]:
        envelopes = [Envelope.from_message(m) for m in messages]
        try:
            # In a "publish" span when tracing is on (django_outbox.tracing).
            return tracing.publish(transport, envelopes, deadline)
        except Exception as exc:  # a transport bug must not leave rows stuck in sending
            return self._raised(destination, messages, exc)

    def _hand_over(
        self,
        transport: Transport,
        destination: str,
        messages: Sequence[OutboxMessage],
        deadline: float,
    ) -> Callable[[], dict[Any, Any]]:
        """Hand *messages* over to an overlapping transport; what waits for and returns
        their outcomes."""
        envelopes = [Envelope.from_message(m) for m in messages]
        try:
            # In a "publish" span when tracing is on, ended by collect().
            collected = tracing.hand_over(transport, envelopes, deadline)
        except Exception as exc:
            failed = self._raised(destination, messages, exc)
            return lambda: failed

        def collect() -> dict[Any, Any]:
            try:
                return collected()
            except Exception as exc:
                return self._raised(destination, messages, exc)

        return collect

    def _raised(
        self, destination: str, messages: Sequence[OutboxMessage], exc: Exception
    ) -> dict[Any, Any]:
        """The outcomes of a publish whose transport raised *exc*: some of the batch may
        have gone out before it raised, so every message is uncertain."""
        self.logger.error("transport for %r raised", destination, exc_info=exc)
        return dict.fromkeys(
            (m.message_id for m in messages), UncertainError(f"{type(exc).__name__}: {exc}")
        )

    def claim_variant(self) -> Any:
        """The destinations whose circuit is open in this process (their rows are left
        alone until a probe is due); an empty set while every destination answers."""
        if not self.settings.outbox.circuit_breaker:
            return frozenset()
        return circuits.blocked()

    def narrow_claim(self, queryset: Any, variant: Any) -> Any:
        if variant:
            return queryset.exclude(destination__in=sorted(variant))
        return queryset

    def next_wake(self) -> float | None:
        """Seconds until an open circuit's probe is due: an idle relay polls then."""
        return circuits.next_probe_in() if self.settings.outbox.circuit_breaker else None

    def done_values(self, now: clock.Instant | None) -> Mapping[str, Any]:
        return {"sent_at": now, "finished_at": now}

    def max_attempts(self, row: Any) -> int:
        config = self.settings.outbox.destinations.get(row.destination)
        return config.max_attempts if config else self.config.max_attempts

    def holds_uncertain(self, row: Any) -> bool:
        config = self.settings.outbox.destinations.get(row.destination)
        return config is not None and config.uncertain == "hold"

    def held_values(self, row: Any, now: clock.Instant) -> Mapping[str, Any]:
        return {"uncertain": True}

    def requeue_values(self) -> Mapping[str, Any]:
        return {"uncertain": False}

    def on_done(self, rows: Sequence[Any]) -> None:
        signals.emit(signals.outbox_messages_sent, Relay, messages=list(rows))
        counts: dict[str, int] = defaultdict(int)
        for row in rows:
            counts[row.destination] += 1
        for destination, count in counts.items():
            self.logger.info(
                "sent %d message(s) to %r",
                count,
                destination,
                extra={"part": self.name, "destination": destination, "count": count},
            )
        if self.logger.isEnabledFor(10):  # DEBUG: one line per message
            for row in rows:
                self.logger.debug("sent %s (%s → %s)", row.message_id, row.type, row.destination)

    def log_fields(self, row: Any) -> dict[str, Any]:
        fields = super().log_fields(row)
        fields.update(
            id=str(row.message_id), type=row.type, destination=row.destination, key=row.key
        )
        return fields

    def on_failed(self, row: Any, error: str, will_retry: bool) -> None:
        self.log_failure(
            row,
            "message %s (%s → %s) attempt %d failed%s: %s",
            will_retry,
            row.message_id,
            row.type,
            row.destination,
            row.attempts,
            ", will retry" if will_retry else ", moved to send_error",
            error,
        )
        signals.emit(
            signals.outbox_message_failed, Relay, message=row, error=error, will_retry=will_retry
        )

    def on_rescued(self, result: RescueResult) -> None:
        signals.emit(signals.outbox_messages_rescued, Relay, resent=result.resent, held=result.held)


triggers.register_task(Publishing.name, DELIVER_TASK)


class Relay(Runner):
    """Moves outbox rows to their transports: the engine's runner over ``Publishing``.

    ``Relay(using=..., batch_size=..., config=..., clock=..., rng=...)``;
    *clock* (a callable returning a datetime) pins the time for tests,
    otherwise the database's clock is used.
    """

    result_class = RelayResult

    def __init__(self, **options: Any) -> None:
        super().__init__(Publishing(**options))

    def claimable(self, at: datetime | None = None) -> Any:
        """Due messages whose key has no earlier unfinished message (the claim's query)."""
        part = Publishing(using=self.using, clock=(lambda: at) if at is not None else None)
        assert part.ordering is not None
        return ordering.heads_only(part.due(), part.ordering)


def _outcome(error: Any, breaker: bool) -> Outcome:
    """The outcome of one message's publish. With the breaker on, a destination that is
    down backs off as a whole (its circuit), not per message: a message refused before
    anything was handed over is deferred with its attempt uncounted, one whose connection
    dropped after it was handed over is uncertain (counted, the ``UNCERTAIN`` policy
    applies) and due again at once, both kept from the claims while the circuit is open."""
    if breaker and isinstance(error, DestinationDown):
        if isinstance(error, UnreachableError):
            # Due since it was due: the health page's oldest due row shows the outage.
            return Defer(None, f"destination unreachable (attempt not counted): {error}")
        return Uncertain(str(error) or type(error).__name__, delay=0.0)
    return from_error(error)


def _chunks(messages: list[OutboxMessage], size: int) -> Iterator[list[OutboxMessage]]:
    """*messages* in chunks of *size*; a message whose relay died during its last
    attempt goes alone."""
    chunk: list[OutboxMessage] = []
    for message in messages:
        if message.unclean_end:
            if chunk:
                yield chunk
                chunk = []
            yield [message]
            continue
        chunk.append(message)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _probe(messages: list[OutboxMessage], turn: int) -> OutboxMessage:
    """The message that probes a destination on its *turn*-th probe: one of the heads of
    *messages* (in publish order; a head is unkeyed or the first of its key here, so it
    may go first), a different one each turn. Always the first would let one message
    that cannot connect by itself (a ``{type}`` in the URL's host) fail every probe and
    keep the destination's other messages waiting while it is up."""
    seen: set[str] = set()
    heads = []
    for message in messages:
        if message.key is None or message.key not in seen:
            heads.append(message)
            if message.key is not None:
                seen.add(message.key)
    return heads[turn % len(heads)]


def _publish_order(message: OutboxMessage) -> tuple[Any, ...]:
    # Keyed messages in (key, sequence) order; the rest keep their claim order.
    return (message.key is not None, message.key or "", message.sequence or 0, message.pk)


__all__ = ["Publishing", "Relay", "RelayResult"]
