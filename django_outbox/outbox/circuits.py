"""Destination circuits: back off a destination that is down, not each of its messages.

When a destination cannot be reached (connection refused or reset, a connect
timeout, DNS, a broker that is away), every message to it fails for the same
reason. Counting that as each message's attempt, with each message waiting
out its own exponential backoff, leaves the backlog trickling out long after
the destination is back. Instead the relay keeps one circuit per destination:

- ``closed``: messages are sent as usual.
- ``open``: the destination failed at the connection level (a transport raised
  :class:`~django_outbox.exceptions.DestinationDown`); claims leave its rows
  alone (other destinations keep flowing) until the next probe is due:
  ``CIRCUIT_PROBE_SECONDS`` after opening, doubled after each failed probe up
  to ``CIRCUIT_PROBE_MAX_SECONDS``.
- ``probing`` (half-open): one claim of this process publishes one message
  first; if the destination answers (whatever the answer: a 4xx is the
  message's problem, not the destination's), the circuit closes and the rest
  of the batch goes at once; if not, it opens again with a longer wait.

The messages of a failed publish are not backed off one by one: one refused
before anything was handed over (:class:`~django_outbox.exceptions.UnreachableError`)
goes back to due with its attempt not counted; one whose connection dropped
after it was handed over (:class:`~django_outbox.exceptions.ConnectionLostError`)
is uncertain, so its attempt counts and the destination's ``UNCERTAIN`` policy
applies, but it is due again at once. Both wait for the circuit, not for a
backoff, and leave when the circuit closes.

The state is per process: each relay (and each Celery worker process) probes
on its own. That needs no shared writes, cannot wedge a destination if a
process dies mid-probe, and costs one connection attempt per process and
probe interval; a relay whose circuit is still closed may try a batch and
find the destination down itself, which costs those rows nothing.

:class:`Circuit` is the state machine (no I/O, times passed in);
:class:`Circuits` keeps this process's circuits and logs their changes.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass, field

from django_outbox import conf

logger = logging.getLogger("django_outbox.outbox")

#: While a circuit stays open, its WARNING is repeated this often (seconds).
REMIND_SECONDS = 60.0


class CircuitState(enum.Enum):
    """Where a destination's circuit stands in this process."""

    #: Messages go out as usual.
    CLOSED = "closed"
    #: The destination is down: its rows are not claimed until the next probe is due.
    OPEN = "open"
    #: One claim is trying the destination with one message.
    PROBING = "probing"


class Gate(enum.Enum):
    """What a relay may do with a destination's claimed rows now."""

    #: Send them all.
    SEND = "send"
    #: Send one first, as the probe; the rest only if the destination answered.
    PROBE = "probe"
    #: Send none: give them back unattempted (another claim is probing, or it is open).
    WAIT = "wait"


@dataclass
class Circuit:
    """One destination's circuit; *now* values are ``time.monotonic()`` seconds."""

    destination: str
    probe_seconds: float
    probe_max_seconds: float
    state: CircuitState = CircuitState.CLOSED
    #: Failed probes since it opened (the wait doubles with each).
    failures: int = 0
    #: When the next probe is due (``OPEN``).
    probe_at: float = 0.0
    #: When it opened (``None`` while closed).
    opened_at: float | None = None
    #: The connection error that opened it, or failed the last probe.
    error: str = ""
    #: Probes granted so far: the relay probes with another message each time, so one
    #: message that cannot connect (its own host) cannot hold the destination closed.
    probes: int = 0

    def claimable(self, now: float) -> bool:
        """Whether a claim may take this destination's rows now."""
        if self.state is CircuitState.CLOSED:
            return True
        return self.state is CircuitState.OPEN and now >= self.probe_at

    def allow(self, now: float) -> Gate:
        """What a relay holding rows of this destination may do; the first caller after
        the probe is due gets ``PROBE`` (and the circuit is ``PROBING``), others wait."""
        if self.state is CircuitState.CLOSED:
            return Gate.SEND
        if self.state is CircuitState.OPEN and now >= self.probe_at:
            self.state = CircuitState.PROBING
            self.probes += 1
            return Gate.PROBE
        return Gate.WAIT

    def failed(self, now: float, error: str) -> bool:
        """The destination failed at the connection level: open (again), with the next
        probe further away. True if it was closed until now."""
        opened = self.state is CircuitState.CLOSED
        if opened:
            self.failures = 0
            self.opened_at = now
        wait = min(self.probe_seconds * 2**self.failures, self.probe_max_seconds)
        self.failures += 1
        self.state = CircuitState.OPEN
        self.probe_at = now + wait
        self.error = error
        return opened

    def succeeded(self) -> bool:
        """The destination answered: close. True if it was open or probing until now."""
        if self.state is CircuitState.CLOSED:
            return False
        self.state = CircuitState.CLOSED
        self.failures = 0
        return True

    def abandoned(self) -> None:
        """A probe ended without an answer either way (out of time, stopped): open, with
        the probe due at once, so the next claim tries again."""
        if self.state is CircuitState.PROBING:
            self.state = CircuitState.OPEN


@dataclass
class Circuits:
    """This process's circuits, one per destination (made on first failure)."""

    _circuits: dict[str, Circuit] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: Destinations whose circuit is not closed: the common case (none) costs a check.
    _troubled: int = 0
    _reminded: dict[str, float] = field(default_factory=dict)

    def enabled(self) -> bool:
        return conf.get_settings().outbox.circuit_breaker

    def blocked(self, now: float | None = None) -> frozenset[str]:
        """Destinations whose rows a claim must leave alone now (open, probe not due; or
        probing)."""
        if not self._troubled:
            return frozenset()
        now = time.monotonic() if now is None else now
        with self._lock:
            return frozenset(
                name for name, circuit in self._circuits.items() if not circuit.claimable(now)
            )

    def state(self, destination: str) -> CircuitState:
        """The state of *destination*'s circuit in this process."""
        circuit = self._circuits.get(destination)
        return CircuitState.CLOSED if circuit is None else circuit.state

    def next_probe_in(self, now: float | None = None) -> float | None:
        """Seconds until the earliest probe of an open circuit is due (``None``: none)."""
        if not self._troubled:
            return None
        now = time.monotonic() if now is None else now
        with self._lock:
            waits = [
                max(c.probe_at - now, 0.0)
                for c in self._circuits.values()
                if c.state is CircuitState.OPEN
            ]
        return min(waits) if waits else None

    def allow(self, destination: str, now: float | None = None) -> Gate:
        """See :meth:`Circuit.allow`; ``SEND`` while the breaker is off."""
        circuit = self._circuits.get(destination)
        if circuit is None:
            return Gate.SEND
        now = time.monotonic() if now is None else now
        with self._lock:
            return circuit.allow(now)

    def probes(self, destination: str) -> int:
        """How many probes of *destination* this process has started (0: none)."""
        circuit = self._circuits.get(destination)
        return 0 if circuit is None else circuit.probes

    def failed(self, destination: str, error: str, now: float | None = None) -> None:
        """*destination* failed at the connection level: open its circuit (WARNING)."""
        now = time.monotonic() if now is None else now
        settings = conf.get_settings().outbox
        with self._lock:
            circuit = self._circuits.get(destination)
            if circuit is None:
                circuit = self._circuits[destination] = Circuit(
                    destination,
                    settings.circuit_probe_seconds,
                    settings.circuit_probe_max_seconds,
                )
            was_closed = circuit.state is CircuitState.CLOSED
            opened = circuit.failed(now, error)
            if was_closed:
                self._troubled += 1
            wait = circuit.probe_at - now
            remind = now - self._reminded.get(destination, -REMIND_SECONDS) >= REMIND_SECONDS
            if opened or remind:
                self._reminded[destination] = now
        extra = {"part": "outbox", "destination": destination, "circuit": circuit.state.value}
        if opened:
            logger.warning(
                "destination %r is unreachable: circuit open, its messages wait (not counted "
                "as attempts); probing again in %.2fs: %s",
                destination,
                wait,
                error,
                extra=extra,
            )
            from django_outbox import metrics

            metrics.counted("outbox", "circuit_opened", destination)
        elif remind:
            assert circuit.opened_at is not None
            logger.warning(
                "destination %r still unreachable after %.0fs (%d probes failed); probing "
                "again in %.2fs: %s",
                destination,
                now - circuit.opened_at,
                circuit.failures - 1,
                wait,
                error,
                extra=extra,
            )
        else:
            logger.debug(
                "probe of %r failed; next in %.2fs: %s", destination, wait, error, extra=extra
            )

    def succeeded(self, destination: str, now: float | None = None) -> None:
        """*destination* answered: close its circuit if it was open (INFO)."""
        circuit = self._circuits.get(destination)
        if circuit is None or circuit.state is CircuitState.CLOSED:
            return
        now = time.monotonic() if now is None else now
        with self._lock:
            closed = circuit.succeeded()
            if closed:
                self._troubled -= 1
                self._reminded.pop(destination, None)
        if closed:
            down = now - circuit.opened_at if circuit.opened_at is not None else 0.0
            logger.info(
                "destination %r answers again after %.1fs: circuit closed, sending what waits",
                destination,
                down,
                extra={"part": "outbox", "destination": destination, "circuit": "closed"},
            )

    def abandoned(self, destination: str) -> None:
        """A probe of *destination* ended without an answer: the next claim probes."""
        circuit = self._circuits.get(destination)
        if circuit is not None:
            with self._lock:
                circuit.abandoned()

    def reset(self) -> None:
        """Forget every circuit (settings changed; tests)."""
        with self._lock:
            self._circuits.clear()
            self._reminded.clear()
            self._troubled = 0


#: This process's circuits.
circuits = Circuits()
conf.on_change(circuits.reset)


__all__ = ["Circuit", "CircuitState", "Circuits", "Gate", "circuits"]
