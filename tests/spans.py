"""Capturing the spans a test makes: OpenTelemetry's SDK with an in-memory exporter.

The SDK's tracer provider can be installed once per process, so it is installed the
first time a test captures spans and stays; its spans go nowhere except while a
test capturing them runs (``_Switch``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class _Switch(SpanProcessor):
    """Hands spans to the processors of the tests running now, to none otherwise."""

    def __init__(self) -> None:
        self.processors: list[SpanProcessor] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        for processor in self.processors:
            processor.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        for processor in self.processors:
            processor.on_end(span)


_switch = _Switch()
_installed = False


def install() -> _Switch:
    """The SDK's provider, installed globally once, feeding the switch."""
    global _installed
    if not _installed:
        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            current.add_span_processor(_switch)
        else:
            provider = TracerProvider()
            provider.add_span_processor(_switch)
            trace.set_tracer_provider(provider)
        _installed = True
    return _switch


class Spans:
    """The spans finished during a test, in the order they ended."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter

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

    def clear(self) -> None:
        self.exporter.clear()


def capture() -> Iterator[Spans]:
    """The spans made until the generator is closed (OpenTelemetry's SDK, sampling
    everything): a test module's ``spans`` fixture is ``yield from capture()``."""
    switch = install()
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    switch.processors.append(processor)
    try:
        yield Spans(exporter)
    finally:
        switch.processors.remove(processor)


def traceparent_of(span: Any) -> str:
    """The W3C ``traceparent`` naming *span* (sampled)."""
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
