"""The transport interface."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, ClassVar
from uuid import UUID

from django.core import checks

from django_outbox.conf import Destination, suggest
from django_outbox.exceptions import DeliveryError, PermanentError, UncertainError
from django_outbox.outbox.envelope import Envelope

logger = logging.getLogger("django_outbox.transport")

#: Per message id: ``None`` when published, the error otherwise. A message
#: missing from the mapping was not attempted (held back behind its key).
Outcomes = dict[UUID, DeliveryError | None]


class Transport:
    """Publishes batches of envelopes to one destination.

    A transport is built once per process and destination and reused; it must
    keep its connections open between batches and reconnect after failures.
    ``publish`` receives envelopes of one key in sequence order and must not
    publish a message after an earlier message of the same key failed.
    """

    #: Option names (lower-case) this transport requires.
    required_options: ClassVar[tuple[str, ...]] = ()
    #: Every option name it reads (lower-case); others are reported as probable typos
    #: (``CONFRIM``). ``None``: not declared, nothing is reported.
    known_options: ClassVar[frozenset[str] | None] = None
    #: Seconds one publish may wait when ``TIMEOUT`` is not set (``None``: no timeout).
    default_timeout: ClassVar[float | None] = None

    #: Most messages per ``publish`` call; the relay records each call's outcomes
    #: before the next (``None``: the whole batch in one call). Slow transports
    #: (HTTP) set it so a relay killed mid-batch leaves little unrecorded.
    chunk_size: int | None = None

    #: Whether :meth:`hand_over` sends a batch without waiting for the destination's
    #: answers, which :meth:`collect` then waits for (RabbitMQ's publisher confirms).
    #: The relay then hands its next batch over before it records this one.
    overlaps: bool = False

    def __init__(self, destination: Destination) -> None:
        self.destination = destination
        self.options = destination.options

    @classmethod
    def check(cls, destination: Destination) -> list[checks.CheckMessage]:
        """System-check problems with *destination*'s options: required ones missing
        (E010), unknown ones (W017, with the closest known name)."""
        problems: list[checks.CheckMessage] = [
            checks.Error(
                f"destination {destination.name!r}: {name.upper()} is required for the "
                f"{destination.transport} transport",
                id="django_outbox.E010",
            )
            for name in cls.required_options
            if not destination.options.get(name)
        ]
        known = cls.known_options
        if known is not None:
            known = known | set(cls.required_options)
            upper = {n.upper() for n in known}
            for name in sorted(set(destination.options) - known):
                hint = suggest(name.upper(), upper)
                problems.append(
                    checks.Warning(
                        f"destination {destination.name!r}: the {destination.transport} "
                        f"transport has no option {name.upper()}{hint}; it is ignored",
                        hint="Known options: " + ", ".join(sorted(n.upper() for n in known)),
                        id="django_outbox.W017",
                    )
                )
        problems.extend(cls._check_timeout(destination))
        return problems

    @classmethod
    def _check_timeout(cls, destination: Destination) -> list[checks.CheckMessage]:
        from django_outbox.conf import get_settings

        try:
            timeout = float(destination.options.get("timeout", cls.default_timeout or 0))
        except (TypeError, ValueError):
            return []  # reported when the transport is built
        lease = get_settings().outbox.engine.lease_seconds
        if not timeout or timeout < lease / 5:
            return []
        # The relay starts no publish in the last fifth of a lease; one publish
        # longer than that fifth can still outlast the lease.
        return [
            checks.Warning(
                f"destination {destination.name!r}: TIMEOUT ({timeout:g}s) is not below a "
                f"fifth of LEASE_SECONDS ({lease:g}s): a slow publish can outlast the lease "
                "and the message be sent twice",
                hint="Raise LEASE_SECONDS or lower TIMEOUT.",
                id="django_outbox.W015",
            )
        ]

    def publish(self, envelopes: Sequence[Envelope], deadline: float | None = None) -> Outcomes:
        """Publish *envelopes* one by one; a failed key skips its later messages.

        *deadline* (a ``time.monotonic()`` value) is when the relay's lease
        runs short: messages not started by then are left unattempted, so a
        slow batch never outlives its lease and gets sent twice.
        """
        outcomes: Outcomes = {}
        failed_keys: set[str] = set()
        for envelope in envelopes:
            if deadline is not None and time.monotonic() >= deadline:
                logger.warning(
                    "lease running out: %d message(s) of %r left for the next batch",
                    len(envelopes) - len(outcomes),
                    self.destination.name,
                )
                break
            if envelope.key is not None and envelope.key in failed_keys:
                continue
            try:
                self.publish_one(envelope)
            except DeliveryError as exc:
                outcomes[envelope.message_id] = exc
            except UnicodeError as exc:  # this message cannot be encoded: retrying will not help
                outcomes[envelope.message_id] = PermanentError(f"cannot encode the message: {exc}")
            except Exception as exc:  # a transport bug must not lose the row
                logger.exception("unexpected error publishing %s", envelope.message_id)
                # It may have gone out before the error: uncertain, not merely retryable.
                outcomes[envelope.message_id] = UncertainError(f"{type(exc).__name__}: {exc}")
            else:
                outcomes[envelope.message_id] = None
                continue
            if envelope.key is not None:
                failed_keys.add(envelope.key)
        return outcomes

    def hand_over(self, envelopes: Sequence[Envelope], deadline: float | None = None) -> Any:
        """Send *envelopes* and return what :meth:`collect` needs for their outcomes,
        without waiting for answers where the transport ``overlaps``. By default the
        whole ``publish``."""
        return self.publish(envelopes, deadline)

    def collect(self, handed: Any) -> Outcomes:
        """The outcomes of what :meth:`hand_over` returned *handed* for, once known."""
        outcomes: Outcomes = handed
        return outcomes

    def publish_one(self, envelope: Envelope) -> None:
        """Publish one envelope or raise ``RetryableError``/``PermanentError``."""
        raise NotImplementedError(f"{type(self).__name__} must implement publish or publish_one")

    def close(self) -> None:
        """Release connections (called on settings change and at shutdown)."""
