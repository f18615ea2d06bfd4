"""The ``DJANGO_OUTBOX`` setting, validated into typed objects.

One dict, in sections::

    DJANGO_OUTBOX = {
        # shared: how work is triggered and how workers prove they are alive
        "DISPATCH": "celery",
        # engine defaults for every part (each part's section may override them)
        "LEASE_SECONDS": 60.0,
        "OUTBOX": {"DESTINATIONS": {...}, "MAX_PAYLOAD_BYTES": 262144},
        "INBOX": {...},
        "JOBS": {...},
        # the health probe's token and the thresholds of its checks
        "HEALTH": {"TOKEN": "...", "OLDEST_DUE_WARNING_SECONDS": 60.0},
    }

Settings are read lazily and re-read when Django's ``setting_changed`` signal
fires, so ``override_settings`` works in tests. Every key, its unit and its
default is documented in ``docs/reference/settings.md``. This module imports
nothing from the parts: transports are named here by dotted path only.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, cast

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import Signal, receiver

from django_outbox.exceptions import ConfigurationError, UnknownDestination

SETTING_NAME = "DJANGO_OUTBOX"

UncertainPolicy = Literal["resend", "hold"]
DispatchMode = Literal["celery", "notify", "none"]

UNCERTAIN_POLICIES: tuple[UncertainPolicy, ...] = ("resend", "hold")
DISPATCH_MODES: tuple[DispatchMode, ...] = ("celery", "notify", "none")

#: Built-in transport aliases; any other value is a dotted path to a class.
TRANSPORT_ALIASES: Mapping[str, str] = {
    "kombu": "django_outbox.outbox.transports.kombu.KombuTransport",
    "celery": "django_outbox.outbox.transports.celery.CeleryTransport",
    "http": "django_outbox.outbox.transports.http.HttpTransport",
    "memory": "django_outbox.outbox.transports.memory.MemoryTransport",
    "local": "django_outbox.outbox.transports.local.LocalTransport",
}

#: Engine keys: allowed at the top level (defaults for every part) and in each
#: part's section (that part only).
ENGINE_DEFAULTS: Mapping[str, Any] = {
    "BATCH_SIZE": 500,
    "LEASE_SECONDS": 60.0,
    "RETRY_BASE_SECONDS": 2.0,
    "RETRY_MAX_SECONDS": 3600.0,
    "MAX_ATTEMPTS": 20,
    "RETENTION_DAYS": 7.0,
    "PURGE_BATCH_SIZE": 1000,
    "PARTITIONS_AHEAD": 7,
    "DRAIN_SECONDS": 5.0,
    "HANDBACK_SECONDS": 1.0,
}

#: Keys that exist once, at the top level.
SHARED_DEFAULTS: Mapping[str, Any] = {
    "DISPATCH": "celery",
    "DISPATCH_IN_BACKGROUND": True,
    "DISPATCH_COALESCE_SECONDS": 0.02,
    "NOTIFY_CHANNEL": "django_outbox",
    "HEARTBEAT_SECONDS": 1.0,
    "WORKER_TIMEOUT_SECONDS": 3.0,
    "SWEEP_STALE_SECONDS": 60.0,
    "METRICS": True,
    "TRACING": True,
}

#: Each part's own keys and their defaults (engine keys are allowed on top).
SECTION_DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    "OUTBOX": {
        "DESTINATIONS": {},
        "MAX_PAYLOAD_BYTES": 256 * 1024,
        "CIRCUIT_BREAKER": True,
        "CIRCUIT_PROBE_SECONDS": 0.25,
        "CIRCUIT_PROBE_MAX_SECONDS": 2.0,
    },
    "INBOX": {"GAP_ALERT_SECONDS": 300.0, "SOURCES": {}, "MAX_BODY_BYTES": 256 * 1024},
    "JOBS": {"CELERY_QUEUES": {}},
}

#: The ``HEALTH`` section: who may read the health probe, and when its checks warn or
#: go critical (``django_outbox.health.status``).
HEALTH_DEFAULTS: Mapping[str, Any] = {
    "TOKEN": "",
    "OLDEST_DUE_WARNING_SECONDS": 60.0,
    "OLDEST_DUE_CRITICAL_SECONDS": 600.0,
    "DEAD_LETTERED_MINUTES": 15,
    "DEAD_LETTERED_WARNING": 1,
    "DEAD_LETTERED_CRITICAL": 100,
    "NO_WORKER_SECONDS": 30.0,
    "SWEEP_LATE_CRITICAL_SECONDS": 600.0,
}

#: Keys of the flat layout before sections existed, and what to do instead.
MOVED_KEYS: Mapping[str, str] = {
    "DESTINATIONS": f"set {SETTING_NAME}['OUTBOX']['DESTINATIONS'] instead",
    "MAX_PAYLOAD_BYTES": f"set {SETTING_NAME}['OUTBOX']['MAX_PAYLOAD_BYTES'] instead",
    "DELIVER_TASK_QUEUE": (
        "route the tasks with Celery's task_routes instead, e.g. "
        "CELERY_TASK_ROUTES = {'django_outbox.*': {'queue': 'outbox'}}"
    ),
}

_DESTINATION_KEYS = frozenset({"TRANSPORT", "UNCERTAIN", "MAX_ATTEMPTS"})

#: Upper bounds: beyond them date arithmetic overflows or the value is a typo.
MAXIMUMS: Mapping[str, float] = {
    "LEASE_SECONDS": 86_400,
    "RETRY_BASE_SECONDS": 86_400,
    "RETRY_MAX_SECONDS": 30 * 86_400,
    "RETENTION_DAYS": 36_500,
    "DRAIN_SECONDS": 3_600,
    "HANDBACK_SECONDS": 3_600,
    "DISPATCH_COALESCE_SECONDS": 60,
    "HEARTBEAT_SECONDS": 60,
    "WORKER_TIMEOUT_SECONDS": 3_600,
    "SWEEP_STALE_SECONDS": 86_400,
    "GAP_ALERT_SECONDS": 30 * 86_400,
    "CIRCUIT_PROBE_SECONDS": 3_600,
    "CIRCUIT_PROBE_MAX_SECONDS": 3_600,
    "BATCH_SIZE": 100_000,
    "PURGE_BATCH_SIZE": 1_000_000,
    "PARTITIONS_AHEAD": 1_000,
    "MAX_ATTEMPTS": 1_000_000,
    "OLDEST_DUE_WARNING_SECONDS": 30 * 86_400,
    "OLDEST_DUE_CRITICAL_SECONDS": 30 * 86_400,
    # The per-minute counts are kept two hours (engine.telemetry.KEEP_MINUTES).
    "DEAD_LETTERED_MINUTES": 120,
    "DEAD_LETTERED_WARNING": 1_000_000_000,
    "DEAD_LETTERED_CRITICAL": 1_000_000_000,
    "NO_WORKER_SECONDS": 86_400,
    "SWEEP_LATE_CRITICAL_SECONDS": 30 * 86_400,
}

#: Lower bounds (inclusive) of the numeric keys.
MINIMUMS: Mapping[str, float] = {
    "BATCH_SIZE": 1,
    "LEASE_SECONDS": 0.1,
    "HANDBACK_SECONDS": 0.05,
    "MAX_ATTEMPTS": 1,
    "PURGE_BATCH_SIZE": 1,
    "MAX_PAYLOAD_BYTES": 1,
    "MAX_BODY_BYTES": 1,
    "MAX_BATCH_BYTES": 1,
    "MAX_BATCH": 1,
    "CIRCUIT_PROBE_SECONDS": 0.01,
    "CIRCUIT_PROBE_MAX_SECONDS": 0.01,
    "HEARTBEAT_SECONDS": 0.05,
    "WORKER_TIMEOUT_SECONDS": 0.1,
    "SWEEP_STALE_SECONDS": 1,
    "DEAD_LETTERED_MINUTES": 1,
    "DEAD_LETTERED_WARNING": 1,
    "DEAD_LETTERED_CRITICAL": 1,
}

_INTEGER_KEYS = frozenset(
    {
        "BATCH_SIZE",
        "MAX_ATTEMPTS",
        "PURGE_BATCH_SIZE",
        "PARTITIONS_AHEAD",
        "MAX_PAYLOAD_BYTES",
        "MAX_BODY_BYTES",
        "MAX_BATCH_BYTES",
        "MAX_BATCH",
        "DEAD_LETTERED_MINUTES",
        "DEAD_LETTERED_WARNING",
        "DEAD_LETTERED_CRITICAL",
    }
)


@dataclass(frozen=True)
class EngineSettings:
    """How the engine drives one part's rows (units in the names)."""

    batch_size: int = 500
    lease_seconds: float = 60.0
    retry_base_seconds: float = 2.0
    retry_max_seconds: float = 3600.0
    max_attempts: int = 20
    retention_days: float = 7.0
    purge_batch_size: int = 1000
    #: A partitioned table's partitions made ahead of time by the purge (intervals).
    partitions_ahead: int = 7
    drain_seconds: float = 5.0
    #: A worker whose current step has run this long gives the rows of its batch it has
    #: not started back, so idle workers take them (no row waits behind a long one).
    handback_seconds: float = 1.0


@dataclass(frozen=True)
class Destination:
    """One configured destination: where messages sent ``to=name`` go."""

    name: str
    transport: str
    options: Mapping[str, Any] = field(default_factory=dict)
    uncertain: UncertainPolicy = "resend"
    max_attempts: int = 20

    @property
    def transport_path(self) -> str:
        """Dotted path of the transport class (aliases resolved)."""
        return TRANSPORT_ALIASES.get(self.transport, self.transport)


@dataclass(frozen=True)
class OutboxSettings:
    """The ``OUTBOX`` section: destinations and what ``send()`` accepts."""

    engine: EngineSettings
    destinations: Mapping[str, Destination]
    max_payload_bytes: int
    #: Whether a destination that cannot be reached opens its circuit (the relay stops
    #: sending there and probes) instead of failing each message's attempt.
    circuit_breaker: bool = True
    #: Seconds from a circuit's opening to its first probe; doubled after each failed
    #: probe up to ``circuit_probe_max_seconds``.
    circuit_probe_seconds: float = 0.25
    circuit_probe_max_seconds: float = 2.0

    def destination(self, name: str) -> Destination:
        """Return the destination called *name* or raise ``UnknownDestination``."""
        try:
            return self.destinations[name]
        except KeyError:
            raise UnknownDestination(
                f"unknown outbox destination {name!r}{suggest(name, self.destinations)} "
                f"(configured: {', '.join(sorted(self.destinations)) or 'none'}); "
                f"add it to {SETTING_NAME}['OUTBOX']['DESTINATIONS']"
            ) from None


@dataclass(frozen=True)
class PartSettings:
    """A section with only engine keys so far (``JOBS``)."""

    engine: EngineSettings


#: How an inbox source receives its messages.
SOURCE_TRANSPORTS = ("kombu", "webhook", "celery", "local")
_SOURCE_REQUIRED: Mapping[str, tuple[str, ...]] = {
    "kombu": ("URL", "QUEUE"),
    "webhook": ("SECRET",),
    "celery": (),
    "local": (),
}
_SOURCE_KEYS = frozenset(
    {
        "TRANSPORT",
        "URL",
        "QUEUE",
        "SECRET",
        "TOLERANCE_SECONDS",
        "ACCEPT_V1",
        "HANDLE_IN_REQUEST",
        "PREFETCH",
        "HEARTBEAT",
        "LEASE_SECONDS",
        "MAX_BODY_BYTES",
        "MAX_BATCH_BYTES",
        "MAX_BATCH",
        "TYPE_HEADER",
        "KEY_HEADER",
        "SEQUENCE_HEADER",
        "MESSAGE_ID_HEADER",
        "DEFAULT_TYPE",
        "TRANSPORT_OPTIONS",
        "REPLY_TO",
    }
)


@dataclass(frozen=True)
class Source:
    """One configured inbox source: where messages ``receive(source=name)`` come from."""

    name: str
    transport: str
    #: The other keys, lower-cased (``url``, ``queue``, ``secret``, ``key_header`` …).
    options: Mapping[str, Any] = field(default_factory=dict)
    max_body_bytes: int = 256 * 1024

    def header(self, role: str, default: str) -> str:
        """The header that carries *role* (``type``, ``key``, ``sequence``, ``message_id``)
        for this source: the outbox's own unless the source maps another producer's."""
        return self.mapped_headers.get(role) or default.lower()

    @property
    def handle_in_request(self) -> bool:
        """A webhook source's ``HANDLE_IN_REQUEST``: a sender's first attempt is handled in
        the request's transaction (see ``inbox.consumers.webhook``)."""
        return bool(self.options.get("handle_in_request"))

    @cached_property
    def envelope_headers(self) -> tuple[str, str, str, str]:
        """The headers of the message id, the type, the key and the sequence for this
        source, worked out once (``intake.parse`` reads them for every message)."""
        from django_outbox.wire import HEADER_KEY, HEADER_MESSAGE_ID, HEADER_SEQUENCE, HEADER_TYPE

        return (
            self.header("message_id", HEADER_MESSAGE_ID),
            self.header("type", HEADER_TYPE),
            self.header("key", HEADER_KEY),
            self.header("sequence", HEADER_SEQUENCE),
        )

    @cached_property
    def mapped_headers(self) -> dict[str, str]:
        """The headers this source maps (``TYPE_HEADER`` …), lower-case, by role. Read
        once: every message a consumer or the webhook takes asks four times or more."""
        return {
            name.removesuffix("_header"): str(value).lower()
            for name, value in self.options.items()
            if name.endswith("_header") and value
        }


@dataclass(frozen=True)
class InboxSettings:
    """The ``INBOX`` section: where messages come from and how they are handled."""

    engine: EngineSettings
    #: A strict key waiting this long for a missing sequence raises an alert.
    gap_alert_seconds: float
    sources: Mapping[str, Source] = field(default_factory=dict)
    max_body_bytes: int = 256 * 1024

    def source(self, name: str) -> Source:
        """Return the source called *name* or raise ``ConfigurationError``."""
        try:
            return self.sources[name]
        except KeyError:
            raise ConfigurationError(
                f"unknown inbox source {name!r}{suggest(name, self.sources)} "
                f"(configured: {', '.join(sorted(self.sources)) or 'none'}); "
                f"add it to {SETTING_NAME}['INBOX']['SOURCES']"
            ) from None


@dataclass(frozen=True)
class HealthSettings:
    """The ``HEALTH`` section: the probe's token and the thresholds of the health checks
    (``django_outbox.health.status``); every part is judged by the same ones."""

    #: A caller sending ``Authorization: Bearer <TOKEN>`` may read the probe; ``""``:
    #: staff sessions only.
    token: str = ""
    #: The oldest due row has waited this long: warning, then critical.
    oldest_due_warning_seconds: float = 60.0
    oldest_due_critical_seconds: float = 600.0
    #: Rows dead-lettered (or held as uncertain) in the last this many minutes...
    dead_lettered_minutes: int = 15
    #: ...from this many on: warning, then critical.
    dead_lettered_warning: int = 1
    dead_lettered_critical: int = 100
    #: Rows have been due (or waited for a rescue) this long with no live worker for
    #: their part: critical.
    no_worker_seconds: float = 30.0
    #: A part's sweep is late after ``SWEEP_STALE_SECONDS`` (warning), and critical
    #: after this.
    sweep_late_critical_seconds: float = 600.0


@dataclass(frozen=True)
class Settings:
    """The validated ``DJANGO_OUTBOX`` setting."""

    dispatch: DispatchMode
    dispatch_in_background: bool
    dispatch_coalesce_seconds: float
    notify_channel: str
    heartbeat_seconds: float
    worker_timeout_seconds: float
    sweep_stale_seconds: float
    outbox: OutboxSettings
    inbox: InboxSettings
    jobs: PartSettings
    #: Job queue name → Celery queue of its triggers (unlisted: the same name;
    #: ``"default"``: Celery's default queue and ``task_routes``).
    jobs_celery_queues: Mapping[str, str] = field(default_factory=dict)
    #: Prometheus metrics on (when the ``prometheus`` extra is installed).
    metrics: bool = True
    #: Trace context stored and carried, spans made (when the ``opentelemetry`` extra is
    #: installed).
    tracing: bool = True
    #: The health probe's token and the health checks' thresholds.
    health: HealthSettings = field(default_factory=HealthSettings)

    def engine(self, part: str) -> EngineSettings:
        """The engine settings of *part* (``"outbox"``, ``"inbox"``, ``"jobs"``)."""
        section: OutboxSettings | InboxSettings | PartSettings = getattr(self, part)
        return section.engine


def suggest(name: Any, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of *known*, or ``""``."""
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _number(raw: Mapping[str, Any], key: str, default: Any, path: str) -> Any:
    value = raw.get(key, default)
    where = f"{path}[{key!r}]"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{where} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigurationError(f"{where} must be a finite number, got {value!r}")
    if key in MAXIMUMS and value > MAXIMUMS[key]:
        raise ConfigurationError(f"{where} must be <= {MAXIMUMS[key]:g}, got {value!r}")
    integer = key in _INTEGER_KEYS
    if integer and not isinstance(value, int):
        raise ConfigurationError(f"{where} must be an integer, got {value!r}")
    minimum = MINIMUMS.get(key, 0)
    if value < minimum:
        raise ConfigurationError(f"{where} must be >= {minimum:g}, got {value!r}")
    return int(value) if integer else float(value)


def _choice(value: Any, choices: tuple[str, ...], where: str) -> str:
    if value not in choices:
        raise ConfigurationError(f"{where} must be one of {', '.join(choices)}; got {value!r}")
    return cast(str, value)


def _check_keys(raw: Mapping[str, Any], allowed: Iterable[str], path: str) -> None:
    allowed = set(allowed)
    for key in raw:
        if key in allowed:
            continue
        if key in MOVED_KEYS and path == SETTING_NAME:
            raise ConfigurationError(f"{path}[{key!r}] is no longer read: {MOVED_KEYS[key]}")
        raise ConfigurationError(
            f"{path} has an unknown key {key!r}{suggest(key, allowed)}; "
            f"known keys: {', '.join(sorted(allowed))}"
        )


def _engine(raw: Mapping[str, Any], defaults: EngineSettings, path: str) -> EngineSettings:
    values = {
        key.lower(): _number(raw, key, getattr(defaults, key.lower()), path)
        for key in ENGINE_DEFAULTS
    }
    return EngineSettings(**values)


def _section(raw: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = raw.get(name, {})
    path = f"{SETTING_NAME}[{name!r}]"
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"{path} must be a dict, got {type(value).__name__}")
    _check_keys(value, {*ENGINE_DEFAULTS, *SECTION_DEFAULTS[name]}, path)
    return value


def _destination(name: Any, raw: Any, default_attempts: int) -> Destination:
    path = f"{SETTING_NAME}['OUTBOX']['DESTINATIONS'][{name!r}]"
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"{path}: destination names must be non-empty strings")
    if len(name) > 100:
        raise ConfigurationError(f"{path}: destination names are at most 100 characters")
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"{path} must be a dict, got {type(raw).__name__}")
    transport = raw.get("TRANSPORT")
    if not isinstance(transport, str) or not transport:
        aliases = ", ".join(TRANSPORT_ALIASES)
        raise ConfigurationError(
            f"{path}['TRANSPORT'] is required: one of {aliases} "
            "or a dotted path to a Transport class"
        )
    uncertain = _choice(raw.get("UNCERTAIN", "resend"), UNCERTAIN_POLICIES, f"{path}['UNCERTAIN']")
    attempts = _number(raw, "MAX_ATTEMPTS", default_attempts, path)
    options = {k.lower(): v for k, v in raw.items() if k not in _DESTINATION_KEYS}
    return Destination(
        name=name,
        transport=transport,
        options=options,
        uncertain=cast(UncertainPolicy, uncertain),
        max_attempts=attempts,
    )


def _outbox(raw: Mapping[str, Any], base: EngineSettings) -> OutboxSettings:
    section = _section(raw, "OUTBOX")
    path = f"{SETTING_NAME}['OUTBOX']"
    engine = _engine(section, base, path)
    raw_destinations = section.get("DESTINATIONS", {})
    if not isinstance(raw_destinations, Mapping):
        raise ConfigurationError(f"{path}['DESTINATIONS'] must be a dict")
    destinations = {
        name: _destination(name, value, engine.max_attempts)
        for name, value in raw_destinations.items()
    }
    defaults = SECTION_DEFAULTS["OUTBOX"]
    breaker = section.get("CIRCUIT_BREAKER", defaults["CIRCUIT_BREAKER"])
    if not isinstance(breaker, bool):
        raise ConfigurationError(
            f"{path}['CIRCUIT_BREAKER'] must be True or False, got {breaker!r}"
        )
    probe = _number(section, "CIRCUIT_PROBE_SECONDS", defaults["CIRCUIT_PROBE_SECONDS"], path)
    probe_max = _number(
        section, "CIRCUIT_PROBE_MAX_SECONDS", defaults["CIRCUIT_PROBE_MAX_SECONDS"], path
    )
    if probe_max < probe:
        raise ConfigurationError(
            f"{path}['CIRCUIT_PROBE_MAX_SECONDS'] ({probe_max:g}) must not be below "
            f"CIRCUIT_PROBE_SECONDS ({probe:g})"
        )
    return OutboxSettings(
        engine=engine,
        destinations=destinations,
        max_payload_bytes=_number(
            section, "MAX_PAYLOAD_BYTES", defaults["MAX_PAYLOAD_BYTES"], path
        ),
        circuit_breaker=breaker,
        circuit_probe_seconds=probe,
        circuit_probe_max_seconds=probe_max,
    )


def _inbox(raw: Mapping[str, Any], base: EngineSettings) -> InboxSettings:
    section = _section(raw, "INBOX")
    path = f"{SETTING_NAME}['INBOX']"
    defaults = SECTION_DEFAULTS["INBOX"]
    max_body = _number(section, "MAX_BODY_BYTES", defaults["MAX_BODY_BYTES"], path)
    raw_sources = section.get("SOURCES", {})
    if not isinstance(raw_sources, Mapping):
        raise ConfigurationError(f"{path}['SOURCES'] must be a dict")
    return InboxSettings(
        engine=_engine(section, base, path),
        gap_alert_seconds=_number(
            section, "GAP_ALERT_SECONDS", defaults["GAP_ALERT_SECONDS"], path
        ),
        sources={name: _source(name, value, max_body) for name, value in raw_sources.items()},
        max_body_bytes=max_body,
    )


def _source(name: Any, raw: Any, max_body: int) -> Source:
    path = f"{SETTING_NAME}['INBOX']['SOURCES'][{name!r}]"
    if not isinstance(name, str) or not name or len(name) > 100:
        raise ConfigurationError(f"{path}: source names are non-empty strings of at most 100")
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"{path} must be a dict, got {type(raw).__name__}")
    _check_keys(raw, _SOURCE_KEYS, path)
    transport = _choice(raw.get("TRANSPORT"), SOURCE_TRANSPORTS, f"{path}['TRANSPORT']")
    for required in _SOURCE_REQUIRED[transport]:
        if not raw.get(required):
            raise ConfigurationError(f"{path}['{required}'] is required for a {transport} source")
    if not isinstance(raw.get("ACCEPT_V1", False), bool):
        raise ConfigurationError(f"{path}['ACCEPT_V1'] must be True or False")
    if "HANDLE_IN_REQUEST" in raw:
        if not isinstance(raw["HANDLE_IN_REQUEST"], bool):
            raise ConfigurationError(f"{path}['HANDLE_IN_REQUEST'] must be True or False")
        if transport != "webhook":
            raise ConfigurationError(
                f"{path}['HANDLE_IN_REQUEST'] is a webhook source's ({name!r} is a {transport} "
                "source: inbox_consume handles in the batch's transaction unless --no-handle)"
            )
    if "HEARTBEAT" in raw:
        _number(raw, "HEARTBEAT", None, path)
    if "LEASE_SECONDS" in raw:
        _number(raw, "LEASE_SECONDS", None, path)
    for key in ("MAX_BATCH_BYTES", "MAX_BATCH"):  # a webhook source's batches
        if key in raw:
            _number(raw, key, None, path)
    return Source(
        name=name,
        transport=transport,
        options={k.lower(): v for k, v in raw.items() if k != "TRANSPORT"},
        max_body_bytes=_number(raw, "MAX_BODY_BYTES", max_body, path),
    )


def load(raw: Any) -> Settings:
    """Validate a raw ``DJANGO_OUTBOX`` value; raise ``ConfigurationError`` if wrong."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"{SETTING_NAME} must be a dict, got {type(raw).__name__}")
    _check_keys(
        raw, {*SHARED_DEFAULTS, *ENGINE_DEFAULTS, *SECTION_DEFAULTS, "HEALTH"}, SETTING_NAME
    )
    base = _engine(raw, EngineSettings(), SETTING_NAME)
    channel = raw.get("NOTIFY_CHANNEL", SHARED_DEFAULTS["NOTIFY_CHANNEL"])
    if not isinstance(channel, str) or not channel.isidentifier():
        raise ConfigurationError(f"{SETTING_NAME}['NOTIFY_CHANNEL'] must be an identifier")
    in_background = raw.get("DISPATCH_IN_BACKGROUND", SHARED_DEFAULTS["DISPATCH_IN_BACKGROUND"])
    if not isinstance(in_background, bool):
        raise ConfigurationError(f"{SETTING_NAME}['DISPATCH_IN_BACKGROUND'] must be True or False")
    metrics = raw.get("METRICS", SHARED_DEFAULTS["METRICS"])
    if not isinstance(metrics, bool):
        raise ConfigurationError(f"{SETTING_NAME}['METRICS'] must be True or False")
    tracing = raw.get("TRACING", SHARED_DEFAULTS["TRACING"])
    if not isinstance(tracing, bool):
        raise ConfigurationError(f"{SETTING_NAME}['TRACING'] must be True or False")
    dispatch = _choice(
        raw.get("DISPATCH", SHARED_DEFAULTS["DISPATCH"]),
        DISPATCH_MODES,
        f"{SETTING_NAME}['DISPATCH']",
    )

    def shared(key: str) -> Any:
        return _number(raw, key, SHARED_DEFAULTS[key], SETTING_NAME)

    heartbeat, timeout = shared("HEARTBEAT_SECONDS"), shared("WORKER_TIMEOUT_SECONDS")
    if timeout < 2 * heartbeat:
        raise ConfigurationError(
            f"{SETTING_NAME}['WORKER_TIMEOUT_SECONDS'] ({timeout:g}) must be at least twice "
            f"HEARTBEAT_SECONDS ({heartbeat:g}): one late heartbeat must not declare a live "
            "worker dead"
        )
    return Settings(
        dispatch=cast(DispatchMode, dispatch),
        dispatch_in_background=in_background,
        dispatch_coalesce_seconds=shared("DISPATCH_COALESCE_SECONDS"),
        notify_channel=channel,
        heartbeat_seconds=heartbeat,
        worker_timeout_seconds=timeout,
        sweep_stale_seconds=shared("SWEEP_STALE_SECONDS"),
        outbox=_outbox(raw, base),
        inbox=_inbox(raw, base),
        jobs=_jobs(raw, base),
        jobs_celery_queues=_celery_queues(raw),
        metrics=metrics,
        tracing=tracing,
        health=_health(raw, shared("SWEEP_STALE_SECONDS")),
    )


def _health(raw: Mapping[str, Any], sweep_stale_seconds: float) -> HealthSettings:
    path = f"{SETTING_NAME}['HEALTH']"
    section = raw.get("HEALTH", {})
    if not isinstance(section, Mapping):
        raise ConfigurationError(f"{path} must be a dict, got {type(section).__name__}")
    _check_keys(section, HEALTH_DEFAULTS, path)
    token = section.get("TOKEN", HEALTH_DEFAULTS["TOKEN"])
    if not isinstance(token, str):
        raise ConfigurationError(f"{path}['TOKEN'] must be a string, got {type(token).__name__}")
    values = {
        key.lower(): _number(section, key, default, path)
        for key, default in HEALTH_DEFAULTS.items()
        if key != "TOKEN"
    }
    for warning, critical in (
        ("OLDEST_DUE_WARNING_SECONDS", "OLDEST_DUE_CRITICAL_SECONDS"),
        ("DEAD_LETTERED_WARNING", "DEAD_LETTERED_CRITICAL"),
    ):
        if values[critical.lower()] < values[warning.lower()]:
            raise ConfigurationError(
                f"{path}['{critical}'] ({values[critical.lower()]:g}) must be at least "
                f"{warning} ({values[warning.lower()]:g})"
            )
    if values["sweep_late_critical_seconds"] < sweep_stale_seconds:
        raise ConfigurationError(
            f"{path}['SWEEP_LATE_CRITICAL_SECONDS'] ({values['sweep_late_critical_seconds']:g}) "
            f"must be at least SWEEP_STALE_SECONDS ({sweep_stale_seconds:g}), when a late "
            "sweep starts to warn"
        )
    return HealthSettings(token=token, **values)


#: Jobs run their code, not a publish: unless MAX_ATTEMPTS is set (at the top or
#: in ``JOBS``), a failing job is tried this many times, not the engine's 20.
JOBS_MAX_ATTEMPTS = 3


def _jobs(raw: Mapping[str, Any], base: EngineSettings) -> PartSettings:
    section = _section(raw, "JOBS")
    if "MAX_ATTEMPTS" not in raw:
        base = dataclasses.replace(base, max_attempts=JOBS_MAX_ATTEMPTS)
    return PartSettings(engine=_engine(section, base, f"{SETTING_NAME}['JOBS']"))


def _celery_queues(raw: Mapping[str, Any]) -> dict[str, str]:
    value = _section(raw, "JOBS").get("CELERY_QUEUES", {})
    path = f"{SETTING_NAME}['JOBS']['CELERY_QUEUES']"
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and k and v for k, v in value.items()
    ):
        raise ConfigurationError(f"{path} must map job queue names to Celery queue names")
    return dict(value)


_cached: Settings | None = None

#: Sent when ``DJANGO_OUTBOX`` changed (tests): parts drop what they built from it.
settings_changed = Signal()


def get_settings() -> Settings:
    """Return the current validated settings (cached until settings change)."""
    global _cached
    if _cached is None:
        _cached = load(getattr(django_settings, SETTING_NAME, None))
    return _cached


def on_change(callback: Callable[[], Any]) -> None:
    """Call *callback* whenever ``DJANGO_OUTBOX`` changes (keeps conf free of part imports)."""
    settings_changed.connect(lambda **kwargs: callback(), weak=False)


@receiver(setting_changed)
def _reset_on_change(*, setting: str, **kwargs: Any) -> None:
    global _cached
    if setting == SETTING_NAME:
        _cached = None
        settings_changed.send(sender=Settings)
