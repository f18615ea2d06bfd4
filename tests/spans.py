"""Capturing the spans a test makes: OpenTelemetry's SDK with an in-memory exporter.

Each capture has a tracer provider of its own, handed to django-outbox with
``tracing.use_tracer_provider`` and taken back at the end: the process's global
provider is never installed (OpenTelemetry allows that once per process), so the
tests that run afterwards run with the API alone, as they would without these.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_outbox import tracing


class Spans:
    """The spans finished during a capture, in the order they ended; ``tracer`` makes
    the test's own spans (a request's, a handler's) with the same provider."""

    def __init__(self, provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
        self.provider = provider
        self.exporter = exporter
        self.tracer = provider.get_tracer("tests")

    def all(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.all() if span.name == name]

    def named_prefix(self, prefix: str) -> list[ReadableSpan]:
        return [span for span in self.all() if span.name.startswith(prefix)]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, f"{len(found)} spans named {name!r}: {self.names()}"
        return found[0]

    def names(self) -> list[str]:
        return [span.name for span in self.all()]


def capture() -> Iterator[Spans]:
    """The spans made until the generator is closed (every span sampled): a test
    module's ``spans`` fixture is ``yield from capture()``."""
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
    try:
        yield Spans(provider, exporter)
    finally:
        tracing.use_tracer_provider(None)
        provider.shutdown()


def traceparent_of(span: Any) -> str:
    """The W3C ``traceparent`` naming *span* (sampled)."""
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
