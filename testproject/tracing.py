"""OpenTelemetry's SDK for the test project's processes, configured from the environment.

``TESTPROJECT_SPANS_FILE=<path>`` makes every process that loads the settings (a
``manage.py`` command, a Celery worker) record its spans and append each, as it ends,
to that file as one line of JSON (:func:`span_as_dict`). Tests with real processes give
each process a file and read them back. Without the variable nothing is configured: the
processes run with the API alone, as a project without an SDK does.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import Any

SPANS_FILE_VARIABLE = "TESTPROJECT_SPANS_FILE"


def span_as_dict(span: Any) -> dict[str, Any]:
    """What a test needs of a finished SDK span: ids as hex, parent, links, attributes."""
    context = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_span_id": f"{parent.span_id:016x}" if parent is not None else None,
        "links": [
            {"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
            for link in span.links
        ],
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "events": [event.name for event in span.events],
        "pid": os.getpid(),
    }


class JsonLinesExporter:
    """A span exporter appending one JSON line per span to a file (flushed at once)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = "".join(json.dumps(span_as_dict(span), default=str) + "\n" for span in spans)
        with self._lock, open(self.path, "a", encoding="utf-8") as file:
            file.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def configure_from_environment() -> None:
    """Install an SDK tracer provider writing to ``TESTPROJECT_SPANS_FILE``, if set."""
    path = os.environ.get(SPANS_FILE_VARIABLE)
    if not path:
        return
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "testproject"}))
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))  # type: ignore[arg-type]
    trace.set_tracer_provider(provider)
