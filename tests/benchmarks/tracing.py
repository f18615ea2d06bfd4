"""What tracing costs ``send()`` and the relay.

    python -m tests.benchmarks.tracing --messages 20000 --rounds 5

In one process on PostgreSQL (a database of its own), relaying to a real Redis, in
rounds that take turns between the modes (so a slower minute of the machine hits
every mode):

- ``off``: ``TRACING`` False and no SDK: the path of a project without
  opentelemetry-api (one cached check);
- ``api``: ``TRACING`` on, the API without an SDK: no span is valid, nothing is
  stored;
- ``sdk, TRACING off``: the SDK records the application's own request spans
  (a ``BatchSpanProcessor`` with an exporter that drops them), django-outbox does
  nothing: the baseline of ``sdk``;
- ``sdk``: the same with ``TRACING`` on: ``send()`` stores the request span's
  ``traceparent``, the relay makes a ``publish`` span per batch linked to each
  message's context (every message from a trace of its own: the most links).

Paths: ``send()`` (one message per transaction, each in a request span of its
own) and ``Relay(batch_size=500).drain()`` to a Redis queue (the rows as each
mode's ``send()`` would have stored them). Per mode and path: messages per second
of wall-clock time (median over the rounds) and CPU microseconds per message of
this process, median and best; costs are read on the best CPU times (the least
disturbed run of each mode: medians move by several per cent between identical
runs on a 2-core machine shared with PostgreSQL and Redis). The target (issue
15): tracing off costs nothing measurable; on, at most 5 % of ``send()`` and
relay throughput (``sdk`` against ``sdk, TRACING off``). Reported, never
asserted.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import time
import uuid
from datetime import date
from typing import Any

from tests.benchmarks import common

BENCH_DB = os.environ.get(
    "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/django_outbox_tracing_bench"
)
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
QUEUE = f"bench-tracing-{uuid.uuid4().hex[:8]}"
SETTINGS = {
    "DISPATCH": "none",
    "OUTBOX": {
        "DESTINATIONS": {"default": {"TRANSPORT": "kombu", "URL": REDIS_URL, "QUEUE": QUEUE}}
    },
    "BATCH_SIZE": 500,
    "METRICS": False,
}
os.environ["DATABASE_URL"] = BENCH_DB
os.environ["DEBUG"] = "0"  # production-like: no per-query bookkeeping
os.environ["OUTBOX_SETTINGS_JSON"] = json.dumps(SETTINGS)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
MODES = ("off", "api", "sdk, TRACING off", "sdk")


def setup_django() -> None:
    common.ensure_database(BENCH_DB)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


class Mode:
    """Switches tracing and the SDK for one measurement (the SDK is never installed as
    the global provider: each mode hands its provider to django-outbox directly)."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )
        from opentelemetry.trace import NoOpTracer, NoOpTracerProvider

        class Dropped(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        self.provider = TracerProvider()
        self.provider.add_span_processor(BatchSpanProcessor(Dropped()))
        self.noop = NoOpTracer()
        self.no_sdk = NoOpTracerProvider()
        #: The application's tracer (its request spans) in the current mode.
        self.application: Any = self.noop
        self.name = "off"

    def set(self, name: str) -> None:
        from django_outbox import tracing

        self.provider.force_flush()
        self.name = name
        with_sdk = name.startswith("sdk")
        tracing._enabled = name in ("api", "sdk")  # as TRACING and an installed API say
        tracing.use_tracer_provider(self.provider if with_sdk else self.no_sdk)
        self.application = self.provider.get_tracer("bench") if with_sdk else self.noop

    def headers(self) -> dict[str, str]:
        """What ``send()`` stores in this mode: a context of its own per message with the
        SDK and tracing on, nothing otherwise."""
        if self.name != "sdk":
            return {}
        return {"traceparent": f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"}


def truncate() -> None:
    import redis
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_outbox_message, django_outbox_key")
    client = redis.Redis.from_url(REDIS_URL)
    client.delete(QUEUE)
    client.close()


def timed(work: Any) -> tuple[float, float]:
    gc.collect()  # no collection of the previous run's garbage inside this one
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def bench_send(mode: Mode, messages: int) -> tuple[float, float]:
    from django.db import transaction

    import django_outbox

    tracer = mode.application

    def work() -> None:
        for n in range(messages):
            with tracer.start_as_current_span("request"), transaction.atomic():
                django_outbox.send("bench.sent", {"n": n})

    result = timed(work)
    if mode.name == "sdk":  # the mode measured what it claims to
        from django_outbox.models import OutboxMessage

        assert not OutboxMessage.objects.filter(headers={}).exists()
    return result


def bench_relay(mode: Mode, messages: int) -> tuple[float, float]:
    from django_outbox.models import OutboxMessage
    from django_outbox.outbox.relay import Relay

    OutboxMessage.objects.bulk_create(
        OutboxMessage(
            message_id=uuid.uuid4(),
            type="bench.sent",
            destination="default",
            payload={"n": n},
            headers=mode.headers(),
        )
        for n in range(messages)
    )
    result = timed(lambda: Relay(batch_size=500).drain())
    assert not OutboxMessage.objects.filter(state="should_be_sent").exists()
    return result


PATHS = {"send()": bench_send, "relay": bench_relay}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--informational", action="store_true", help="(CI) a smoke run")
    args = parser.parse_args()
    setup_django()
    mode = Mode()
    figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for round_ in range(args.rounds + 1):  # the first round warms up, not counted
            order = MODES if round_ % 2 else tuple(reversed(MODES))
            for path, bench in PATHS.items():
                for name in order:
                    truncate()
                    mode.set(name)
                    wall, cpu = bench(mode, args.messages)
                    if round_:
                        figures.setdefault((path, name), []).append((wall, cpu))
    finally:
        truncate()
        mode.provider.shutdown()
    print(
        f"\n### Tracing overhead ({args.messages} messages, {args.rounds} rounds; "
        f"{date.today()}, {platform.python_version()}, {os.cpu_count()} CPUs)\n"
    )
    print(
        "| path | mode | messages/s (median) | CPU µs/message (median) | CPU µs/message "
        "(best) | CPU vs off (best) | CPU vs sdk, TRACING off (best) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for path in PATHS:
        best = {name: min(c for _, c in figures[path, name]) for name in MODES}
        for name in MODES:
            runs = figures[path, name]
            rate = statistics.median(args.messages / w for w, _ in runs)
            cpu = statistics.median(c / args.messages * 1e6 for _, c in runs)
            against_sdk = f"{best[name] / best['sdk, TRACING off']:.3f}" if name == "sdk" else ""
            print(
                f"| {path} | {name} | {rate:,.0f} | {cpu:.1f} | "
                f"{best[name] / args.messages * 1e6:.1f} | {best[name] / best['off']:.3f} | "
                f"{against_sdk} |"
            )


if __name__ == "__main__":
    main()
