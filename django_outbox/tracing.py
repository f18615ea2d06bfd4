"""Tracing: the trace context travels with every message and job, and OpenTelemetry
spans show what happened to them (the ``opentelemetry`` extra).

Guarantee: the span a handler or a job runs in belongs to the trace that was current
when the message was sent or the job enqueued, across processes, transports and
retries, so one trace shows a request, the messages it sent, their publication, their
arrival and their handlers, and so on down the chain (a handler's own ``send()`` and
``enqueue()`` continue it).

Mechanism: ``send()`` and ``receive()`` store the current context in the row's headers
through OpenTelemetry's global propagator (by default W3C ``traceparent`` and
``tracestate``, and W3C ``baggage`` when there is any); ``enqueue()`` stores the W3C
``traceparent`` in the job's column. Every transport carries the headers. Spans, named
and described by OpenTelemetry's messaging conventions:

- ``publish <destination>`` (producer): one per transport call of the relay (a batch of
  one destination), a child of its messages' context when they share one, otherwise
  linked to each (at most ``MAX_LINKS``);
- ``receive <source>`` (consumer): one per batch a consumer stores (``inbox_consume``, the
  Celery task, the webhook view), parented or linked the same way;
- ``handle <type>`` (consumer): one per handler run, a child of the message's context;
- ``run <task path>`` (consumer): one per job attempt, a child of the enqueue context.

A message that arrives with a context keeps it: ``receive()`` stores the current one only
when the headers carry no ``traceparent``. A handler or a job runs with its span current,
so the spans of its own code and of instrumented libraries nest under it. A failure
(a handler's or a job's exception, a transport's error) sets the span's status to ERROR
and records the exception.

Price: without the ``opentelemetry-api`` package, or with ``DJANGO_OUTBOX['TRACING'] =
False``, :func:`enabled` is false and nothing here costs more than that check. With the
API and no SDK, spans are not recorded: ``send()`` looks up the current span and stores
nothing when there is none. With an SDK, ``send()`` pays a propagator's inject (a few
microseconds against a commit's milliseconds), and the relay one span per batch, not per
message, with a link per distinct context of the batch (a ``traceparent`` is read with a
regular expression, not the propagator); ``make bench-tracing`` measures both
(docs/benchmarks.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from django_outbox.conf import Source, get_settings, on_change
from django_outbox.wire import HEADER_MESSAGE_ID

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from django_outbox.inbox.intake import Arrival
    from django_outbox.inbox.models import InboxMessage
    from django_outbox.jobs.models import Job
    from django_outbox.outbox.envelope import Envelope
    from django_outbox.outbox.transports.base import Outcomes, Transport

try:
    from opentelemetry import baggage, propagate, trace
    from opentelemetry.context import Context as _Context
    from opentelemetry.trace import (
        NonRecordingSpan,
        SpanContext,
        SpanKind,
        Status,
        StatusCode,
        TraceFlags,
    )
except ImportError:  # the extra is not installed
    trace = None  # type: ignore[assignment]

TRACEPARENT = "traceparent"
SENTRY_TRACE = "sentry-trace"
#: Most links one batch span gets. Each link costs the relay about 10 µs in the SDK:
#: 128 (the SDK's own limit) cost a 500-message batch of distinct traces 2-4 µs a
#: message, 32 cost 0.7 (``make bench-tracing``). The chain that matters does not
#: need them: each message carries its producer's context to its receive and handle
#: spans; the links only tie a publish batch to the requests it carried.
MAX_LINKS = 32
#: The instrumentation scope of every span made here.
SCOPE = "django_outbox"

#: OpenTelemetry's messaging attributes.
SYSTEM = "messaging.system"
DESTINATION = "messaging.destination.name"
MESSAGE_ID = "messaging.message.id"
CONVERSATION_ID = "messaging.message.conversation_id"
BATCH_COUNT = "messaging.batch.message_count"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
#: Ours: what the conventions have no name for.
MESSAGE_TYPE = "django_outbox.message.type"
MESSAGE_KEY = "django_outbox.message.key"
ATTEMPT = "django_outbox.attempt"
TASK = "django_outbox.task"

#: ``messaging.system`` of a kombu URL's scheme (other schemes: the scheme itself).
KOMBU_SYSTEMS = {
    "amqp": "rabbitmq",
    "amqps": "rabbitmq",
    "pyamqp": "rabbitmq",
    "redis": "redis",
    "rediss": "redis",
    "sqs": "aws_sqs",
}
#: ``messaging.system`` of the other built-in transports and sources.
TRANSPORT_SYSTEMS = {
    "celery": "celery",
    "http": "http",
    "webhook": "http",
    "local": "django_outbox",
    "memory": "memory",
}

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")

_enabled: bool | None = None
_tracer: Tracer | None = None
_NULL: AbstractContextManager[None] = nullcontext()


def enabled() -> bool:
    """Whether tracing is on: ``opentelemetry-api`` installed and ``TRACING`` on."""
    global _enabled
    if _enabled is None:
        _enabled = trace is not None and get_settings().tracing
    return _enabled


def _reset() -> None:
    global _enabled
    _enabled = None


on_change(_reset)


def tracer() -> Tracer:
    """The tracer of every span made here (it follows the global tracer provider, even
    one set after the first span)."""
    global _tracer
    if _tracer is None:
        _tracer = trace.get_tracer(SCOPE)
    return _tracer


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Make the spans here with *provider* instead of the global one (``None``: the global
    one again): for tests and benchmarks, since OpenTelemetry lets a process install its
    global provider only once."""
    global _tracer, _own_provider
    _tracer = provider.get_tracer(SCOPE) if provider is not None else None
    _own_provider = provider is not None


_own_provider = False


def recording() -> bool:
    """Whether a span made now could be recorded: a tracer provider has been installed
    (globally, or here with :func:`use_tracer_provider`). Without one, OpenTelemetry's
    API makes no span, only passes the parent's context on; a root span would be
    nothing at all, so the hot paths skip building it. Asked on every call: a provider
    installed later is seen at once."""
    return _own_provider or not isinstance(
        trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    )


# -- the context stored with rows ------------------------------------------------------


def inject(headers: dict[str, str], context: Mapping[str, str] | None = None) -> None:
    """Add the current context to *headers* (a row's, in ``send()`` and ``receive()``)
    unless they carry a ``traceparent`` already: a message keeps the context it came
    with. *context* is ``context_headers()`` read by the caller once for a batch;
    ``None`` reads it now."""
    for name in headers:
        if name.lower() == TRACEPARENT:
            return
    if context is None:
        context = context_headers()
    for name, value in context.items():
        headers.setdefault(name, value)


def context_headers() -> dict[str, str]:
    """The headers that carry the current context (``traceparent``, ``baggage``): empty
    with neither a valid span nor baggage current, without asking the propagator (it
    costs ``send()`` more than both lookups)."""
    if not trace.get_current_span().get_span_context().is_valid and not baggage.get_all():
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def current_traceparent() -> str:
    """The W3C ``traceparent`` of the span current now, ``""`` when there is none (what
    ``enqueue()`` stores with a job)."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return ""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def parse_traceparent(value: Any) -> SpanContext | None:
    """The span context a W3C ``traceparent`` names (remote), or ``None`` if *value* is
    not one (malformed, version ``ff``, all-zero ids)."""
    if not isinstance(value, str):
        return None
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return None
    version, trace_hex, span_hex, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if not trace_id or not span_id:
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(int(flags, 16)))


def _span_context_of(headers: Mapping[str, Any]) -> SpanContext | None:
    context = context_of(headers)
    return trace.get_current_span(context).get_span_context() if context is not None else None


def context_of(headers: Mapping[str, Any] | None) -> Context | None:
    """The context carried by *headers* (through the global propagator), ``None`` when
    they carry none."""
    if not headers:
        return None
    extracted = propagate.extract(headers)
    if not trace.get_current_span(extracted).get_span_context().is_valid:
        return None
    return extracted


# -- spans ------------------------------------------------------------------------------


@contextmanager
def _span(
    name: str,
    kind: SpanKind,
    attributes: dict[str, Any],
    carriers: Iterable[Mapping[str, Any]],
) -> Iterator[Span]:
    """A span current for the block, for a batch of messages whose headers are
    *carriers*: a child of their context when they carry one and the same one, else
    (several, or none) a child of the current span, linked to each of theirs.

    A context is told by its ``traceparent``, or by its ``sentry-trace`` when a Sentry
    propagator stored no ``traceparent``. Links are read from a ``traceparent`` directly
    (a regular expression: the relay's budget), from anything else through the
    propagator."""
    with trace.use_span(_start_span(name, kind, attributes, carriers), end_on_exit=True) as span:
        yield span


def _start_span(
    name: str,
    kind: SpanKind,
    attributes: dict[str, Any],
    carriers: Iterable[Mapping[str, Any]],
) -> Span:
    """The span of :func:`_span`, started and not made current."""
    contexts: dict[str, Mapping[str, Any]] = {}
    for headers in carriers:
        value = headers.get(TRACEPARENT) or headers.get(SENTRY_TRACE)
        if value and isinstance(value, str) and value not in contexts:
            contexts[value] = headers
    parent = context_of(next(iter(contexts.values()))) if len(contexts) == 1 else None
    span = tracer().start_span(name, context=parent, kind=kind, attributes=attributes)
    if len(contexts) > 1 and span.is_recording():
        linked = 0
        for value, headers in contexts.items():
            span_context = parse_traceparent(value) or _span_context_of(headers)
            if span_context is not None:
                span.add_link(span_context)
                linked += 1
                if linked >= MAX_LINKS:
                    break
    return span


def publish(
    transport: Transport, envelopes: Sequence[Envelope], deadline: float | None
) -> Outcomes:
    """``transport.publish(envelopes, deadline)`` in a ``publish`` span (the relay's);
    messages that failed set its status to ERROR, each failure recorded."""
    if not enabled():
        return transport.publish(envelopes, deadline)
    with _span(*_publish_span(transport, envelopes)) as span:
        outcomes = transport.publish(envelopes, deadline)
        _failures(span, outcomes, len(envelopes))
        return outcomes


def hand_over(
    transport: Transport, envelopes: Sequence[Envelope], deadline: float | None
) -> Callable[[], Outcomes]:
    """``transport.hand_over(envelopes, deadline)``; the function returned collects the
    outcomes (``transport.collect``). With tracing on, one ``publish`` span covers both
    and is current during each (not between: the relay runs its next batch there)."""
    if not enabled():
        handed = transport.hand_over(envelopes, deadline)
        return lambda: transport.collect(handed)
    span = _start_span(*_publish_span(transport, envelopes))
    try:
        with trace.use_span(span, end_on_exit=False):
            handed = transport.hand_over(envelopes, deadline)
    except BaseException:
        span.end()  # use_span recorded the exception and the ERROR status
        raise

    def collect() -> Outcomes:
        with trace.use_span(span, end_on_exit=True):
            outcomes = transport.collect(handed)
            _failures(span, outcomes, len(envelopes))
            return outcomes

    return collect


def _publish_span(
    transport: Transport, envelopes: Sequence[Envelope]
) -> tuple[str, SpanKind, dict[str, Any], Iterable[Mapping[str, Any]]]:
    """The name, kind, attributes and context carriers of a relay's ``publish`` span."""
    destination = transport.destination
    attributes = _batch_attributes(
        system_of(destination.transport, destination.options),
        destination.name,
        "send",
        "publish",
        [str(e.message_id) for e in envelopes[:2]],
        len(envelopes),
    )
    return (
        f"publish {destination.name}",
        SpanKind.PRODUCER,
        attributes,
        (e.user_headers for e in envelopes),
    )


def _failures(span: Span, outcomes: Outcomes, count: int) -> None:
    """Messages that failed among *outcomes* (of *count*): each recorded on *span*,
    whose status is then ERROR."""
    if not span.is_recording():
        return
    failed = [error for error in outcomes.values() if error is not None]
    if failed:
        for error in failed[:MAX_LINKS]:
            span.record_exception(error)
        span.set_status(
            Status(StatusCode.ERROR, f"{len(failed)} of {count} message(s) failed: {failed[0]}")
        )


def receiving(source: Source, arrivals: Sequence[Arrival]) -> AbstractContextManager[Any]:
    """A ``receive`` span for the block in which a consumer stores *arrivals*; no span
    when none would be recorded and no arrival carries a context: it would only pass the
    current context on (see :func:`recording`), and a webhook delivery would pay for it."""
    if not enabled() or not arrivals:
        return _NULL
    if not recording() and not any(
        a.headers.get(TRACEPARENT) or a.headers.get(SENTRY_TRACE) for a in arrivals
    ):
        return _NULL
    ids = [str(a.headers.get(HEADER_MESSAGE_ID) or a.transport_id or "") for a in arrivals[:2]]
    attributes = _batch_attributes(
        system_of(source.transport, source.options),
        source.name,
        "receive",
        "receive",
        ids,
        len(arrivals),
    )
    return _span(
        f"receive {source.name}", SpanKind.CONSUMER, attributes, (a.headers for a in arrivals)
    )


def handling(message: InboxMessage, recorded: bool | None = None) -> AbstractContextManager[Any]:
    """A ``handle`` span, current while *message*'s handler runs, a child of the context
    the message carries. An exception that leaves it sets its status to ERROR.
    *recorded* is ``recording()`` asked once for a batch (``None``: asked here)."""
    if not enabled():
        return _NULL
    if not (recording() if recorded is None else recorded):
        headers = message.headers or {}
        if not (headers.get(TRACEPARENT) or headers.get(SENTRY_TRACE)):
            return _NULL  # no parent to pass on and no span to make
    attributes: dict[str, Any] = {
        SYSTEM: _source_system(message.source),
        DESTINATION: message.source,
        OPERATION_TYPE: "process",
        OPERATION_NAME: "handle",
        MESSAGE_ID: message.message_id,
        MESSAGE_TYPE: message.type,
        ATTEMPT: message.attempts,
    }
    if message.correlation_id:
        attributes[CONVERSATION_ID] = message.correlation_id
    if message.key is not None:
        attributes[MESSAGE_KEY] = message.key
    return tracer().start_as_current_span(
        f"handle {message.type}",
        context=context_of(message.headers),
        kind=SpanKind.CONSUMER,
        attributes=attributes,
    )


def running(job: Job) -> AbstractContextManager[Any]:
    """A ``run`` span, current while *job* runs, a child of its enqueue context; the
    job's failure is recorded by :func:`record_failure`."""
    if not enabled() or (not job.traceparent and not recording()):
        return _NULL  # no parent to pass on and no span to make
    span_context = parse_traceparent(job.traceparent)
    parent = (
        trace.set_span_in_context(NonRecordingSpan(span_context), _Context())
        if span_context is not None
        else None
    )
    return tracer().start_as_current_span(
        f"run {job.task_path}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes={
            SYSTEM: "django_outbox",
            DESTINATION: job.queue_name,
            OPERATION_TYPE: "process",
            OPERATION_NAME: "run",
            MESSAGE_ID: str(job.result_id),
            TASK: job.task_path,
            ATTEMPT: job.attempts,
        },
    )


def record_failure(error: BaseException) -> None:
    """Mark the current span failed by *error* (a job's exception, which the runner
    catches inside its ``run`` span)."""
    if not enabled():
        return
    span = trace.get_current_span()
    if span.is_recording():
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


# -- attributes ------------------------------------------------------------------------


def system_of(transport: str, options: Mapping[str, Any]) -> str:
    """``messaging.system`` of a destination or source: by the kombu URL's scheme
    (``rabbitmq``, ``redis`` …), else by the transport (``celery``, ``http``, and
    ``django_outbox`` for the local one and for classes of your own)."""
    if transport == "kombu":
        url = str(options.get("url") or "")
        scheme = url.split("://", 1)[0].lower() if "://" in url else "kombu"
        return KOMBU_SYSTEMS.get(scheme, scheme)
    return TRANSPORT_SYSTEMS.get(transport, "django_outbox")


_source_systems: dict[str, str] = {}


def _source_system(name: str) -> str:
    system = _source_systems.get(name)
    if system is None:
        source = get_settings().inbox.sources.get(name)
        system = system_of(source.transport, source.options) if source else "django_outbox"
        _source_systems[name] = system
    return system


on_change(_source_systems.clear)


def _batch_attributes(
    system: str, destination: str, kind: str, name: str, ids: Sequence[str], count: int
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        SYSTEM: system,
        DESTINATION: destination,
        OPERATION_TYPE: kind,
        OPERATION_NAME: name,
    }
    if count == 1:
        attributes[MESSAGE_ID] = ids[0]
    else:
        attributes[BATCH_COUNT] = count
    return attributes


__all__ = [
    "current_traceparent",
    "enabled",
    "handling",
    "inject",
    "parse_traceparent",
    "publish",
    "receiving",
    "record_failure",
    "recording",
    "running",
    "use_tracer_provider",
]
