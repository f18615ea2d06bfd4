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

With ``BATCH`` above 1 (a django-outbox receiver only), up to that many messages go
in one request, signed as a batch (``b2=``, see ``django_outbox.signing``); the
receiver answers for each message, and each gets its own outcome.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx  # optional dependency: django-outbox-inbox[http]
from django.core import checks

from django_outbox import signing
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

logger = logging.getLogger("django_outbox.transport")

RETRYABLE_STATUSES = frozenset({408, 425, 429})
#: ``BATCH_BYTES`` by default: the most bytes of messages one batch request carries.
DEFAULT_BATCH_BYTES = 1024 * 1024
#: How much of an error response body is kept in ``last_error``.
ERROR_BODY_CHARS = 500


class HttpTransport(Transport):
    """POSTs each message to ``URL``, ``CONCURRENCY`` requests at a time.

    Options: ``URL`` (required; ``{type}`` is substituted), ``SECRET`` (HMAC
    key; strongly recommended), ``TIMEOUT`` (seconds, ``10``), ``HEADERS``
    (extra static headers; per-message ones win), ``VERIFY`` (TLS verification, ``True``),
    ``CONCURRENCY`` (requests in flight, ``8``; messages of one key still go
    one after another, in order), ``BATCH`` (most messages a request, ``1``: one
    request each; above 1 the receiver must be django-outbox's webhook view) and
    ``BATCH_BYTES`` (most bytes of messages a batch request, 1 MiB).

    The relay records outcomes every ``4 * CONCURRENCY`` messages (``CONCURRENCY *
    BATCH`` with batches), so a relay killed mid-batch leaves at most that many
    delivered but unrecorded.
    """

    required_options = ("url",)
    default_timeout = 10.0
    known_options = frozenset(
        {"url", "secret", "timeout", "headers", "verify", "concurrency", "batch", "batch_bytes"}
    )

    def __init__(self, destination: Destination) -> None:
        super().__init__(destination)
        self.url = str(self.options["url"])
        self.secret: str | None = self.options.get("secret")
        timeout = float(self.options.get("timeout", 10.0))
        self.concurrency = max(1, int(self.options.get("concurrency", 8)))
        self.batch = max(1, int(self.options.get("batch", 1)))
        self.batch_bytes = max(1, int(self.options.get("batch_bytes", DEFAULT_BATCH_BYTES)))
        self.chunk_size = 4 * self.concurrency if self.batch == 1 else self.concurrency * self.batch
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
        """Publish concurrently: one lane per key (in order), unkeyed messages each alone;
        with ``BATCH``, up to ``CONCURRENCY`` lanes of batch requests."""
        if self.batch > 1 and len(envelopes) > 1:
            return self._publish_batched(envelopes, deadline)
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

    def _publish_batched(self, envelopes: Sequence[Envelope], deadline: float | None) -> Outcomes:
        """Up to ``CONCURRENCY`` lanes, each a key's messages together in order (unkeyed
        ones spread), each lane's batches posted one after the other."""
        count = min(self.concurrency, -(-len(envelopes) // self.batch))
        lanes: list[list[Envelope]] = [[] for _ in range(count)]
        lane_of: dict[str, int] = {}
        turn = 0
        for envelope in envelopes:
            if envelope.key is None:
                lane = turn % count
                turn += 1
            elif (lane := lane_of.get(envelope.key, -1)) < 0:
                lane = lane_of[envelope.key] = turn % count
                turn += 1
            lanes[lane].append(envelope)
        if count == 1:
            return self._publish_lane(lanes[0], deadline)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="outbox-http")
        outcomes: Outcomes = {}
        for lane_outcomes in self._pool.map(lambda lane: self._publish_lane(lane, deadline), lanes):
            outcomes.update(lane_outcomes)
        return outcomes

    def _publish_lane(self, lane: Sequence[Envelope], deadline: float | None) -> Outcomes:
        """Post *lane* in batches; a key that fails skips its later messages."""
        outcomes: Outcomes = {}
        failed_keys: set[str] = set()
        for chunk, items in self._batches(lane):
            if deadline is not None and time.monotonic() >= deadline:
                logger.warning(
                    "lease running out: %d message(s) of %r left for the next batch",
                    len(lane) - len(outcomes),
                    self.destination.name,
                )
                break
            if failed_keys:
                kept = [i for i, e in enumerate(chunk) if e.key is None or e.key not in failed_keys]
                chunk, items = [chunk[i] for i in kept], [items[i] for i in kept]
            if len(chunk) == 1:
                done = super().publish(chunk, deadline)
            elif chunk:
                done = self._post_batch(chunk, items, deadline)
            else:
                continue
            for envelope in chunk:
                if envelope.key is not None and (
                    envelope.message_id not in done or done[envelope.message_id] is not None
                ):
                    failed_keys.add(envelope.key)
            outcomes.update(done)
        return outcomes

    def _batches(self, lane: Sequence[Envelope]) -> Iterator[tuple[list[Envelope], list[bytes]]]:
        """*lane* cut into batches of at most ``BATCH`` messages and ``BATCH_BYTES`` (a
        larger message goes alone), each message as its JSON item; with ``{type}`` in
        the URL, a batch holds one type."""
        by_type = "{type}" in self.url
        chunk: list[Envelope] = []
        items: list[bytes] = []
        size = 0
        for envelope in lane:
            try:
                item = self.batch_item(envelope)
            except (UnicodeError, ValueError, TypeError):
                # It goes alone, as a request of its own: what fails to encode then is
                # that message's outcome, not its batch's.
                if chunk:
                    yield chunk, items
                    chunk, items, size = [], [], 0
                yield [envelope], [b""]
                continue
            if chunk and (
                len(chunk) >= self.batch
                or size + len(item) > self.batch_bytes
                or (by_type and envelope.type != chunk[0].type)
            ):
                yield chunk, items
                chunk, items, size = [], [], 0
            chunk.append(envelope)
            items.append(item)
            size += len(item) + 1
        if chunk:
            yield chunk, items

    def batch_item(self, envelope: Envelope) -> bytes:
        """*envelope* as an item of a batch: ``{"headers": {…}, "body": "<the body>"}``,
        its headers those a request of its own would carry (lower-case names, the
        ``Idempotency-Key`` among them)."""
        idempotency_key = signing.IDEMPOTENCY_HEADER.lower()
        if self.static_headers or envelope.user_headers:
            headers = dict(self.static_headers)
            headers.update((name.lower(), value) for name, value in envelope.headers.items())
            headers[idempotency_key] = envelope.id_text()
            header_text = json.dumps(headers, ensure_ascii=False, separators=(",", ":"))
        else:
            standard = envelope.headers_json()
            header_text = f'{standard[:-1]},"{idempotency_key}":"{envelope.id_text()}"}}'
        body = json.dumps(envelope.body_text(), ensure_ascii=False)
        return f'{{"headers":{header_text},"body":{body}}}'.encode()

    def _post_batch(
        self, chunk: Sequence[Envelope], items: Sequence[bytes], deadline: float | None
    ) -> Outcomes:
        """POST *chunk* as one batch and read the receiver's answer for each message."""
        body = b'{"messages":[' + b",".join(items) + b"]}"
        url = self.url.replace("{type}", chunk[0].type)
        headers = dict(self.static_headers)
        headers["content-type"] = "application/json"
        if self.secret:
            headers[signing.SIGNATURE_HEADER.lower()] = signing.sign_batch(self.secret, body)
        try:
            response = self._post(url, body, [(k.encode(), v.encode()) for k, v in headers.items()])
            if response.status_code == 413:
                # The receiver takes smaller batches: these messages one by one.
                logger.warning(
                    "%s: a batch of %d is too large for %s", self.destination.name, len(chunk), url
                )
                return super().publish(chunk, deadline)
            self._raise_for(response, url)
        except DeliveryError as exc:
            return _each(chunk, exc)
        except Exception as exc:  # a transport bug must not lose the rows
            logger.exception("unexpected error posting a batch of %d", len(chunk))
            # It may have gone out before the error: uncertain, not merely retryable.
            return _each(chunk, UncertainError(f"{type(exc).__name__}: {exc}"))
        return _answers(chunk, response, url)

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
        for name in ("batch", "batch_bytes"):
            value = destination.options.get(name, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(
                    checks.Error(
                        f"destination {destination.name!r}: {name.upper()} must be a whole "
                        f"number of at least 1, got {value!r}",
                        id="django_outbox.E017",
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
        self._raise_for(self._post(url, body, self.request_headers(envelope, body)), url)

    def _post(self, url: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> Any:
        """POST *body*; raise the ``DeliveryError`` a failure to get an answer is."""
        try:
            return self.client.post(url, content=body, headers=headers)
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

    @staticmethod
    def _raise_for(response: Any, url: str) -> None:
        """Raise the ``DeliveryError`` a status other than 2xx is."""
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


def _each(chunk: Sequence[Envelope], error: DeliveryError) -> Outcomes:
    return {envelope.message_id: error for envelope in chunk}


def _answers(chunk: Sequence[Envelope], response: Any, url: str) -> Outcomes:
    """Each message's outcome from the answer to its batch: stored or a duplicate is
    sent, refused is a permanent failure, skipped (behind its key's refused one) is
    left unattempted. An answer without a result for each message, in order, says
    nothing about any: all are uncertain (the receiver may have stored them)."""
    try:
        results = response.json()["results"]
        if not isinstance(results, list) or len(results) != len(chunk):
            raise ValueError(f"{len(results)} results")
    except (ValueError, KeyError, TypeError) as exc:
        return _each(
            chunk,
            UncertainError(
                f"the answer of {url} to a batch of {len(chunk)} has no result for each "
                f"message ({type(exc).__name__}: {exc}); is it django-outbox's webhook view?"
            ),
        )
    outcomes: Outcomes = {}
    for envelope, result in zip(chunk, results, strict=True):
        status = result.get("status") if isinstance(result, dict) else None
        if isinstance(result, dict) and result.get("message_id") != envelope.id_text():
            outcomes[envelope.message_id] = UncertainError(
                f"the answer of {url} for a batch's message names another: {result!r}"
            )
        elif status in ("stored", "duplicate"):
            outcomes[envelope.message_id] = None
        elif status == "refused":
            outcomes[envelope.message_id] = PermanentError(
                f"refused by {url}: {result.get('reason', '')}"
            )
        elif status != "skipped":
            outcomes[envelope.message_id] = UncertainError(
                f"the answer of {url} for a batch's message is {result!r}"
            )
    return outcomes


def _snippet(response: Any) -> str:
    try:
        text = str(response.text)
    except Exception:
        return "<unreadable body>"
    return text[:ERROR_BODY_CHARS]
