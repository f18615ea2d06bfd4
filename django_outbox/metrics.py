"""Prometheus metrics: the ``prometheus`` extra (``django-outbox-inbox[prometheus]``).

Counters and histograms are updated by the engine as it records outcomes
(``engine.telemetry``), by ``send()``/``receive()``/``enqueue()`` and by the
parts' steps; gauges of backlog and age are read from the database when
Prometheus scrapes, cached for ``GAUGE_CACHE_SECONDS`` (see
``MetricsCollector``). Every name is listed in ``docs/operations.md``.

Exposed by :func:`metrics_view` (route it yourself, protect it like any
internal endpoint) and by the long-running commands' ``--metrics-port``.
Several processes (Celery's prefork pool, gunicorn workers, several relays on a
host) need prometheus-client's multiprocess mode: set ``PROMETHEUS_MULTIPROC_DIR``
to an empty directory before any process starts; :func:`registry` then merges
what every process wrote there.

Without prometheus-client, or with ``DJANGO_OUTBOX['METRICS'] = False``,
:func:`enabled` is false and nothing here costs more than that check.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.http import HttpRequest, HttpResponse

from django_outbox.conf import get_settings, on_change
from django_outbox.engine.transitions import Change, Transition

if TYPE_CHECKING:
    from django_outbox.engine.part import Part

try:
    import prometheus_client
    from prometheus_client import Counter, Histogram
except ImportError:  # the extra is not installed
    prometheus_client = None  # type: ignore[assignment]

#: Seconds a scrape's database figures are reused by the next scrapes.
GAUGE_CACHE_SECONDS = 10.0

#: The label each part's metrics carry: where its rows go, come from or run.
LABELS = {"outbox": "destination", "inbox": "source", "jobs": "queue"}
#: The row field each label is read from.
LABEL_FIELDS = {"outbox": "destination", "inbox": "source", "jobs": "queue_name"}
#: The engine's events under each part's own names.
NAMES = {
    "outbox": {
        "done": "sent",
        "retried": "retried",
        "dead": "dead_lettered",
        "held": "held",
        "rescued": "rescued",
    },
    "inbox": {
        "done": "handled",
        "retried": "retried",
        "dead": "dead_lettered",
        "skipped": "skipped",
        "rescued": "rescued",
    },
    "jobs": {
        "done": "succeeded",
        "retried": "retried",
        "dead": "dead_lettered",
        "rescued": "rescued",
    },
}
#: What each part counts besides the engine's events.
EXTRA_COUNTERS = {
    "outbox": {
        "enqueued": "messages stored by send()",
        "circuit_opened": "times a destination's circuit opened in a relay process (the "
        "destination could not be reached)",
    },
    "inbox": {
        "received": "messages stored by receive() and the consumers",
        "duplicates": "messages refused as already stored (same source and id)",
    },
    "jobs": {"enqueued": "jobs stored by enqueue()", "started": "job attempts started"},
}
_HELP = {
    "done": "rows finished successfully",
    "retried": "failed attempts that will be retried",
    "dead": "rows dead-lettered (failed for good: waiting for an operator)",
    "held": "rows held as uncertain (published or not: an operator decides)",
    "skipped": "rows skipped by their handler or ordering",
    "rescued": "rows taken back from dead workers or expired leases",
    "failed": "failed attempts (retried, dead-lettered or held)",
}
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

_enabled: bool | None = None


def enabled() -> bool:
    """Whether metrics are kept: prometheus-client installed and ``METRICS`` on."""
    global _enabled
    if _enabled is None:
        _enabled = prometheus_client is not None and get_settings().metrics
    return _enabled


def _reset() -> None:
    global _enabled
    _enabled = None


on_change(_reset)


class _Metrics:
    """Every counter and histogram, made once per process."""

    def __init__(self) -> None:
        self.events: dict[tuple[str, str], Any] = {}
        self.failed: dict[str, Any] = {}
        self.extra: dict[tuple[str, str], Any] = {}
        for part, names in NAMES.items():
            label = LABELS[part]
            for event, name in names.items():
                labels = () if event == "rescued" else (label,)
                self.events[part, event] = Counter(
                    f"django_outbox_{part}_{name}", f"{part}: {_HELP[event]}", labels
                )
            self.failed[part] = Counter(
                f"django_outbox_{part}_failed", f"{part}: {_HELP['failed']}", (label,)
            )
            for name, text in EXTRA_COUNTERS[part].items():
                self.extra[part, name] = Counter(
                    f"django_outbox_{part}_{name}", f"{part}: {text}", (label,)
                )
        self.batch_size = Histogram(
            "django_outbox_batch_size",
            "rows recorded together (one group of a claim)",
            ("part",),
            buckets=BATCH_BUCKETS,
        )
        self.publish_latency = Histogram(
            "django_outbox_outbox_publish_latency_seconds",
            "outbox: from the message's commit (its created_at) to its publish being "
            "recorded, on the relay host's clock",
            ("destination",),
            buckets=LATENCY_BUCKETS,
        )
        self.handle_duration = Histogram(
            "django_outbox_inbox_handle_duration_seconds",
            "inbox: how long one message's handler ran",
            ("source",),
            buckets=DURATION_BUCKETS,
        )
        self.run_duration = Histogram(
            "django_outbox_jobs_run_duration_seconds",
            "jobs: how long one job attempt ran",
            ("queue",),
            buckets=DURATION_BUCKETS,
        )


_metrics: _Metrics | None = None


def get() -> _Metrics:
    """The process's metrics (made on first use)."""
    global _metrics
    if _metrics is None:
        _metrics = _Metrics()
    return _metrics


#: The attribute a step sets on a row it ran (seconds its handler or job took), read
#: when the row's outcome is recorded: one histogram update per group, not per row.
STEP_SECONDS = "_django_outbox_step_seconds"


def recorded(part: Part, changes: Sequence[Change]) -> None:
    """Count a recorded group (``engine.telemetry.recorded`` calls this when enabled):
    one increment per event and label, one histogram update per bucket and label,
    whatever the group's size (under a microsecond a row: ``make bench-telemetry``).
    The outbox's rows give their publish latency (from ``created_at``), the inbox's and
    the jobs' the time their step took (``STEP_SECONDS``)."""
    from django_outbox.engine.telemetry import _EVENT_OF

    metrics = get()
    name = part.name
    attribute = LABEL_FIELDS[name]
    done_transition = Transition.MARK_DONE
    done: dict[str, int] = {}
    others: dict[tuple[str, str], int] = {}
    latency = name == "outbox"
    bounds = LATENCY_BUCKETS if latency else DURATION_BUCKETS
    # Per label: the count per bucket, then the sum (see add_bucketed).
    observed: dict[str, list[float]] = {}
    now = datetime.now(UTC)
    for change in changes:
        row = change.row
        label = getattr(row, attribute)
        is_done = change.transition is done_transition
        if is_done:
            done[label] = done.get(label, 0) + 1
        else:
            event = _EVENT_OF.get(change.transition)
            if event is not None:
                others[event, label] = others.get((event, label), 0) + 1
        if latency:
            created = row.created_at if is_done else None
            seconds = (now - created).total_seconds() if created is not None else None
        else:
            seconds = row.__dict__.get(STEP_SECONDS)
        if seconds is not None:
            slots = observed.get(label)
            if slots is None:
                slots = observed[label] = [0.0] * (len(bounds) + 2)
            slots[bisect_left(bounds, seconds)] += 1
            slots[-1] += seconds if seconds > 0 else 0.0
    counter = metrics.events[name, "done"]
    for label, number in done.items():
        counter.labels(label).inc(number)
    failed: dict[str, int] = {}
    for (event, label), number in others.items():
        counted_event = metrics.events.get((name, event))
        if counted_event is not None:
            counted_event.labels(label).inc(number)
        if event in ("retried", "dead", "held"):
            failed[label] = failed.get(label, 0) + number
    for label, number in failed.items():
        metrics.failed[name].labels(label).inc(number)
    histogram = {
        "outbox": metrics.publish_latency,
        "inbox": metrics.handle_duration,
        "jobs": metrics.run_duration,
    }[name]
    for label, slots in observed.items():
        add_bucketed(_child(histogram, label), slots, bounds)
    metrics.batch_size.labels(name).observe(len(changes))


def add_bucketed(histogram: Any, slots: Sequence[float], bounds: Sequence[float]) -> None:
    """Add observations already bucketed to *histogram*: *slots* holds the count per
    bucket of *bounds* (plus one for +Inf), then the sum of the amounts. One update per
    bucket instead of one ``observe()`` per amount (~1-2 µs each). Reaches into
    prometheus-client's histogram child (``_buckets``, ``_sum``, there since 0.4);
    falls back to ``observe`` (of each bucket's bound) if they are not."""
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    counts = slots[:-1]
    if buckets is None or total is None or len(buckets) != len(counts):
        for bound, number in zip((*bounds, float("inf")), counts, strict=True):
            for _ in range(int(number)):
                histogram.observe(bound)
        return
    for index, number in enumerate(counts):
        if number:
            buckets[index].inc(number)
    total.inc(slots[-1])


def rescued(part: str, number: int) -> None:
    """Count rows of *part* taken back from dead workers or expired leases."""
    get().events[part, "rescued"].inc(number)


def counted(part: str, name: str, label: str, number: int = 1) -> None:
    """Count *number* of *part*'s own events (``enqueued``, ``received``...)."""
    if number > 0 and enabled():
        _child(get().extra[part, name], label).inc(number)


def counter(part: str, name: str, label: str) -> Any:
    """The counter of *part*'s own events *name* with *label* (metrics enabled), for a
    caller that counts one event at a time on a hot path and keeps it."""
    return _child(get().extra[part, name], label)


#: (metric, label) -> the metric's child for that label: ``labels()`` takes a lock
#: and builds a tuple (~0.7 µs), which per-row counts would pay each time.
_children: dict[tuple[int, str], Any] = {}


def _child(metric: Any, label: str) -> Any:
    key = (id(metric), label)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(label)
    return child


def counted_on_commit(part: str, name: str, label: str, using: str, number: int = 1) -> None:
    """Count *number* of *part*'s own events once the transaction on *using* commits
    (at once outside one): a rolled-back ``send()`` is not counted."""
    if number > 0 and enabled():
        counter = _child(get().extra[part, name], label)
        if not transaction.get_connection(using).in_atomic_block:
            counter.inc(number)  # committed already (autocommit)
            return
        transaction.on_commit(lambda: counter.inc(number), using=using)


# -- exposition ---------------------------------------------------------------


def multiprocess_dir() -> str | None:
    """prometheus-client's multiprocess directory, if this process uses one."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def registry() -> Any:
    """What a scrape reads: every process's values (multiprocess mode) or this
    process's, plus the database gauges."""
    from prometheus_client import CollectorRegistry, multiprocess

    global _registry
    if _registry is not None:
        return _registry
    if multiprocess_dir():
        made = CollectorRegistry()
        multiprocess.MultiProcessCollector(made)  # type: ignore[no-untyped-call]
    else:
        made = prometheus_client.REGISTRY
    made.register(MetricsCollector())
    _registry = made
    return made


_registry: Any = None


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The metrics in Prometheus' text format (404 when metrics are off)."""
    from django.http import Http404

    if not enabled():
        raise Http404("metrics are off (install django-outbox-inbox[prometheus])")
    get()
    body = prometheus_client.generate_latest(registry())
    return HttpResponse(body, content_type=prometheus_client.CONTENT_TYPE_LATEST)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve the metrics on *port* from a thread of this process (``--metrics-port``)."""
    if prometheus_client is None:
        from django_outbox.exceptions import ConfigurationError

        raise ConfigurationError(
            "--metrics-port needs prometheus-client: pip install 'django-outbox-inbox[prometheus]'"
        )
    get()
    prometheus_client.start_http_server(port, addr=addr, registry=registry())


def process_exited(pid: int) -> None:
    """Tell prometheus-client's multiprocess mode that process *pid* is gone (its
    counters stay summed in; its live gauges are dropped). A no-op otherwise."""
    if prometheus_client is not None and multiprocess_dir():
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


class MetricsCollector:
    """Gauges read from the database at scrape time, cached ``GAUGE_CACHE_SECONDS``.

    One ``health.read()`` (its capped counts, no failure groups) and one sampled query
    per part for the backlog by destination, source or queue: the cost of a scrape
    does not grow with the tables. A database that does not answer makes the scrape
    serve ``django_outbox_scrape_error 1`` and nothing else of ours, rather than fail.
    """

    def __init__(self, using: str | None = None) -> None:
        self.using = using
        self._cached: list[Any] = []
        self._at = -GAUGE_CACHE_SECONDS

    def collect(self) -> Iterator[Any]:
        if time.monotonic() - self._at >= GAUGE_CACHE_SECONDS:
            self._cached = self._read()
            self._at = time.monotonic()
        yield from self._cached

    def describe(self) -> Iterator[Any]:
        return iter(())  # no database query when the collector is registered

    def _read(self) -> list[Any]:
        from django.db import DEFAULT_DB_ALIAS, DatabaseError
        from prometheus_client.core import GaugeMetricFamily

        from django_outbox.health import figures as health_figures
        from django_outbox.health import status

        error = GaugeMetricFamily(
            "django_outbox_scrape_error", "1 if the database could not be read at this scrape"
        )
        using = self.using or DEFAULT_DB_ALIAS
        try:
            health = health_figures.read(using, failures=False)
            report = status.evaluate(health)
            backlog = {name: due_by_label(name, using) for name in health.parts}
        except DatabaseError:
            error.add_metric([], 1)
            return [error]
        finally:
            from django.db import connections

            if not connections[using].in_atomic_block:
                connections[using].close_if_unusable_or_obsolete()
        error.add_metric([], 0)

        def gauge(name: str, text: str, labels: Sequence[str] = ("part",)) -> Any:
            return GaugeMetricFamily(f"django_outbox_{name}", text, labels=list(labels))

        by_label = gauge(
            "backlog",
            f"rows due now per destination, source or queue (up to {BACKLOG_CAP:,} per part)",
            ("part", "name"),
        )
        oldest = gauge("oldest_due_age_seconds", "how long the oldest row due now has waited")
        dead = gauge(
            "dead_letters", "rows waiting for an operator (send_error, handle_error, FAILED)"
        )
        parked = gauge("parked", "rows parked behind a failed row of their key")
        stuck = gauge("stuck_rows", "rows held by dead workers, waiting for their rescue")
        live = gauge("live_workers", "processes with a fresh heartbeat that take this part's rows")
        sweep_age = gauge("sweep_age_seconds", "seconds since this part's last sweep")
        sweep_late = gauge(
            "sweep_late", "1 if no sweep ran for SWEEP_STALE_SECONDS while rows wait"
        )
        checks = gauge(
            "health_status",
            "the health probe's verdict per check: 0 ok, 1 warning, 2 critical",
            ("part", "check"),
        )
        for name, part in health.parts.items():
            for label, number in backlog[name].items():
                by_label.add_metric([name, label], number)
            oldest.add_metric([name], part.oldest_due_seconds or 0.0)
            dead.add_metric([name], _dead_letters(part))
            if part.parked is not None:
                parked.add_metric([name], part.parked.value)
            stuck.add_metric([name], part.stuck)
            live.add_metric([name], part.live_workers)
            if part.sweep.silent_seconds is not None:
                sweep_age.add_metric([name], part.sweep.silent_seconds)
            sweep_late.add_metric([name], 1 if part.sweep.late else 0)
        for check in report.checks:
            checks.add_metric([check.part, check.name], status.EXIT_CODES[check.status])
        return [error, by_label, oldest, dead, parked, stuck, live, sweep_age, sweep_late, checks]


#: Due rows a scrape reads per part to split the backlog by destination, source or queue.
BACKLOG_CAP = 10_000


def due_by_label(part_name: str, using: str) -> dict[str, int]:
    """Rows due now of *part_name* per destination, source or queue, counted among the
    first ``BACKLOG_CAP`` due rows (the claim's own order and index): exact below the
    cap; beyond it, a label whose rows all come later is missing."""
    from collections import Counter

    from django_outbox.engine.part import registered

    part = registered()[part_name](using=using)
    # Read, not grouped in SQL: MySQL/MariaDB refuse a LIMIT inside IN (…).
    labels = part.due().values_list(LABEL_FIELDS[part_name], flat=True)[:BACKLOG_CAP]
    return {str(label): number for label, number in Counter(labels).items()}


def _dead_letters(figures: Any) -> int:
    from django_outbox.engine.part import registered

    failed = registered()[figures.part].lifecycle.failed
    count = figures.states.get(failed)
    return int(count.value) if count is not None else 0
