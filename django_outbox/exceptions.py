"""Exceptions raised by django-outbox.

Errors a caller can act on derive from :class:`OutboxError`. Transports
signal the outcome of a publish with :class:`RetryableError` (try again
later) or :class:`PermanentError` (no point retrying).
"""

from __future__ import annotations


class OutboxError(Exception):
    """Base class of every error django-outbox raises on purpose."""


class ConfigurationError(OutboxError):
    """The ``DJANGO_OUTBOX`` setting is invalid; the message says which key."""


class InvalidMessage(OutboxError, ValueError):
    """``send()`` refused its arguments (type, key, headers, payload); nothing was stored
    and the caller's transaction is still usable. The message says which and why."""


class PayloadError(InvalidMessage):
    """A payload or header value cannot be stored or published (not JSON, NUL, …)."""


class PayloadTooLarge(PayloadError):
    """The serialized payload is larger than ``MAX_PAYLOAD_BYTES``."""


class KeyConflict(OutboxError):
    """``send(key=...)`` in a REPEATABLE READ or SERIALIZABLE transaction lost a race with
    a concurrent sender of the same key; the database aborted the transaction: retry it."""


class UnknownDestination(OutboxError, LookupError):
    """``send(to=...)`` names a destination that is not configured."""


class DeliveryError(OutboxError):
    """Base class of the errors a transport reports for one message."""


class RetryableError(DeliveryError):
    """A failure that may succeed later (broker down, timeout, 5xx)."""


class UncertainError(RetryableError):
    """The message may or may not have arrived: it was handed over, but no answer came
    back (a read timeout, a lost publisher confirm). Retried under the ``resend``
    policy; parked in ``send_error`` as uncertain under ``hold``."""


class DestinationDown(RetryableError):
    """The destination failed, not the message: it could not be reached, or it dropped
    the connection before answering. The relay opens the destination's circuit (see
    ``django_outbox.outbox.circuits``): it stops sending there and probes until it
    answers again, instead of backing off each message on its own."""


class UnreachableError(DestinationDown):
    """Nothing was handed over (connection refused, DNS failure, connect timeout, broker
    not reachable): certainly not delivered, so the attempt is not counted."""


class ConnectionLostError(DestinationDown, UncertainError):
    """The connection dropped after the message was handed over and before an answer
    (reset, closed, protocol error): uncertain, so the attempt counts and the
    ``UNCERTAIN`` policy applies (resent, or held under ``hold``); it is resent when the
    destination's circuit closes, not after a backoff of its own."""


class PermanentError(DeliveryError):
    """A failure that will not succeed by retrying (4xx, rejected message)."""
