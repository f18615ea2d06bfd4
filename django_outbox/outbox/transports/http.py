"""HTTP webhook transport (httpx).

Each message is POSTed as JSON with an ``Idempotency-Key`` header (the
message id), the ``outbox-*`` headers and, when ``SECRET`` is set, an
``Outbox-Signature`` header whose v2 HMAC-SHA256 covers the body, the
timestamp and every ``outbox-*`` header and ``Idempotency-Key`` sent (see
``django_outbox.signing``). 2xx is sent; 408, 425 and 429 are retried like
5xx and timeouts, each message with its own backoff (a live server's answer);
any other status is a permanent failure. A server that cannot be reached
(connection refused, DNS, connect timeout) or that drops the connection before
answering is down as a whole: the destination's circuit opens
(``outbox.circuits``) and its messages wait for it, not for a backoff each.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx  # optional dependency: django-outbox-inbox[http]
from django.core import checks

from django_outbox import signing
from django_outbox.conf import Destination
from django_outbox.exceptions import (
    ConnectionLostError,
    PermanentError,
    RetryableError,
    UncertainError,
    UnreachableError,
)
from django_outbox.outbox.envelope import Envelope
from django_outbox.outbox.transports.base import Outcomes, Transport

RETRYABLE_STATUSES = frozenset({408, 425, 429})
#: How much of an error response body is kept in ``last_error``.
ERROR_BODY_CHARS = 500


class HttpTransport(Transport):
    """POSTs each message to ``URL``, ``CONCURRENCY`` requests at a time.

    Options: ``URL`` (required; ``{type}`` is substituted), ``SECRET`` (HMAC
    key; strongly recommended), ``TIMEOUT`` (seconds, ``10``), ``HEADERS``
    (extra static headers; per-message ones win), ``VERIFY`` (TLS verification, ``True``),
    ``CONCURRENCY`` (requests in flight, ``8``; messages of one key still go
    one after another, in order).

    The relay records outcomes every ``4 * CONCURRENCY`` messages, so a
    relay killed mid-batch leaves at most that many delivered but unrecorded.
    """

    required_options = ("url",)
    default_timeout = 10.0
    known_options = frozenset({"url", "secret", "timeout", "headers", "verify", "concurrency"})

    def __init__(self, destination: Destination) -> None:
        super().__init__(destination)
        self.url = str(self.options["url"])
        self.secret: str | None = self.options.get("secret")
        timeout = float(self.options.get("timeout", 10.0))
        self.concurrency = max(1, int(self.options.get("concurrency", 8)))
        self.chunk_size = 4 * self.concurrency
        #: The static ``HEADERS``, sent (and signed, if ``outbox-*``) with every request.
        self.static_headers = {
            str(name).lower(): str(value)
            for name, value in (self.options.get("headers") or {}).items()
        }
        self.client = httpx.Client(
            timeout=httpx.Timeout(timeout),
            verify=self.options.get("verify", True),
            follow_redirects=False,
            limits=httpx.Limits(max_connections=self.concurrency),
        )
        self._pool: ThreadPoolExecutor | None = None

    def publish(self, envelopes: Sequence[Envelope], deadline: float | None = None) -> Outcomes:
        """Publish concurrently: one lane per key (in order), unkeyed messages each alone."""
        if self.concurrency == 1 or len(envelopes) < 2:
            return super().publish(envelopes, deadline)
        lanes: dict[Any, list[Envelope]] = {}
        for envelope in envelopes:
            lane = envelope.key if envelope.key is not None else envelope.message_id
            lanes.setdefault(lane, []).append(envelope)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="outbox-http")
        outcomes: Outcomes = {}
        for lane_outcomes in self._pool.map(
            lambda lane: super(HttpTransport, self).publish(lane, deadline), lanes.values()
        ):
            outcomes.update(lane_outcomes)
        return outcomes

    @classmethod
    def check(cls, destination: Destination) -> list[checks.CheckMessage]:
        problems = super().check(destination)
        url = str(destination.options.get("url") or "")
        if url and not url.startswith(("http://", "https://")):
            problems.append(
                checks.Error(
                    f"destination {destination.name!r}: URL must start with http:// or https://",
                    id="django_outbox.E014",
                )
            )
        if not destination.options.get("secret"):
            problems.append(
                checks.Warning(
                    f"destination {destination.name!r}: no SECRET, so deliveries are unsigned",
                    hint="Set SECRET so the receiver can verify the Outbox-Signature header.",
                    id="django_outbox.W014",
                )
            )
        return problems

    def request_headers(self, envelope: Envelope, body: bytes) -> list[tuple[bytes, bytes]]:
        """Headers of the POST for *envelope*, as UTF-8 bytes (keys may be non-ASCII).

        One header per lower-case name, later ones winning (static ``HEADERS``,
        then the message's, then ``Idempotency-Key`` and ``Content-Type``): HTTP
        does not tell ``X-A`` from ``x-a``, and the signature covers exactly
        the headers that go out.
        """
        headers = dict(self.static_headers)
        headers.update((name.lower(), value) for name, value in envelope.headers.items())
        headers[signing.IDEMPOTENCY_HEADER.lower()] = str(envelope.message_id)
        headers["content-type"] = "application/json"
        if self.secret:
            headers[signing.SIGNATURE_HEADER.lower()] = signing.sign(
                self.secret, body, headers=headers
            )
        return [(name.encode(), value.encode()) for name, value in headers.items()]

    def publish_one(self, envelope: Envelope) -> None:
        body = envelope.body()
        url = self.url.replace("{type}", envelope.type)
        try:
            response = self.client.post(
                url, content=body, headers=self.request_headers(envelope, body)
            )
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            # Nothing reached the server: the server is down (or not reachable).
            raise UnreachableError(f"{type(exc).__name__}: {exc}") from exc
        except httpx.PoolTimeout as exc:
            # Nothing left this process, but our own pool was busy: not the server's fault.
            raise RetryableError(f"{type(exc).__name__}: {exc}") from exc
        except httpx.TimeoutException as exc:
            # Sent, but no answer in time: the receiver may have acted on it. A slow
            # server is alive: this message backs off, the destination stays open.
            raise UncertainError(f"timeout after {self.client.timeout.read}s: {exc!r}") from exc
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            # The connection dropped before an answer (the server died or restarted
            # mid-request): it may have acted on it, and it is down for the next ones.
            raise ConnectionLostError(f"{type(exc).__name__}: {exc}") from exc
        except httpx.TransportError as exc:
            raise UncertainError(f"{type(exc).__name__}: {exc}") from exc
        status = response.status_code
        if 200 <= status < 300:
            return
        detail = f"HTTP {status} from {url}: {_snippet(response)}"
        if status >= 500 or status in RETRYABLE_STATUSES:
            raise RetryableError(detail)
        raise PermanentError(detail)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self.client.close()


def _snippet(response: Any) -> str:
    try:
        text = str(response.text)
    except Exception:
        return "<unreadable body>"
    return text[:ERROR_BODY_CHARS]
