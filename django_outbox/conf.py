"""The ``DJANGO_OUTBOX`` setting, validated into typed objects.

Settings are read lazily and re-read when Django's ``setting_changed`` signal
fires, so ``override_settings`` works in tests. Every key, its unit and its
default is documented in ``docs/reference/settings.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from django_outbox.exceptions import ConfigurationError

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
}

#: Top-level keys and their defaults (``DESTINATIONS`` is handled apart).
DEFAULTS: Mapping[str, Any] = {
    "MAX_PAYLOAD_BYTES": 256 * 1024,
    "BATCH_SIZE": 500,
    "LEASE_SECONDS": 60.0,
    "RETRY_BASE_SECONDS": 2.0,
    "RETRY_MAX_SECONDS": 3600.0,
    "MAX_ATTEMPTS": 20,
    "RETENTION_DAYS": 7.0,
    "PURGE_BATCH_SIZE": 1000,
    "DISPATCH": "celery",
    "DISPATCH_IN_BACKGROUND": True,
    "DISPATCH_COALESCE_SECONDS": 0.02,
    "DELIVER_TASK_QUEUE": None,
    "DRAIN_SECONDS": 5.0,
    "NOTIFY_CHANNEL": "django_outbox",
}

_DESTINATION_KEYS = frozenset({"TRANSPORT", "UNCERTAIN", "MAX_ATTEMPTS"})


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
    """The validated ``DJANGO_OUTBOX`` setting."""

    destinations: Mapping[str, Destination]
    max_payload_bytes: int
    batch_size: int
    lease_seconds: float
    retry_base_seconds: float
    retry_max_seconds: float
    max_attempts: int
    retention_days: float
    purge_batch_size: int
    dispatch: DispatchMode
    dispatch_in_background: bool
    dispatch_coalesce_seconds: float
    deliver_task_queue: str | None
    drain_seconds: float
    notify_channel: str

    def destination(self, name: str) -> Destination:
        """Return the destination called *name* or raise ``UnknownDestination``."""
        from django_outbox.exceptions import UnknownDestination

        try:
            return self.destinations[name]
        except KeyError:
            known = ", ".join(sorted(self.destinations)) or "none configured"
            raise UnknownDestination(
                f"unknown outbox destination {name!r} (configured: {known}); "
                f"add it to {SETTING_NAME}['DESTINATIONS']"
            ) from None


#: Upper bounds: beyond them date arithmetic overflows or the value is a typo.
MAXIMUMS: Mapping[str, float] = {
    "LEASE_SECONDS": 86_400,
    "RETRY_BASE_SECONDS": 86_400,
    "RETRY_MAX_SECONDS": 30 * 86_400,
    "RETENTION_DAYS": 36_500,
    "DRAIN_SECONDS": 3_600,
    "DISPATCH_COALESCE_SECONDS": 60,
    "BATCH_SIZE": 100_000,
    "PURGE_BATCH_SIZE": 1_000_000,
    "MAX_ATTEMPTS": 1_000_000,
}


def _number(raw: Mapping[str, Any], key: str, kind: type, *, minimum: float, path: str) -> Any:
    value = raw.get(key, DEFAULTS.get(key))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{path}{key} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigurationError(f"{path}{key} must be a finite number, got {value!r}")
    if key in MAXIMUMS and value > MAXIMUMS[key]:
        raise ConfigurationError(f"{path}{key} must be <= {MAXIMUMS[key]:g}, got {value!r}")
    if kind is int and not isinstance(value, int):
        raise ConfigurationError(f"{path}{key} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigurationError(f"{path}{key} must be >= {minimum}, got {value!r}")
    return kind(value)


def _choice(value: Any, choices: tuple[str, ...], where: str) -> str:
    if value not in choices:
        raise ConfigurationError(f"{where} must be one of {', '.join(choices)}; got {value!r}")
    return cast(str, value)


def _destination(name: Any, raw: Any, default_attempts: int) -> Destination:
    path = f"{SETTING_NAME}['DESTINATIONS'][{name!r}]"
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
    attempts = _number(
        {"MAX_ATTEMPTS": raw.get("MAX_ATTEMPTS", default_attempts)},
        "MAX_ATTEMPTS",
        int,
        minimum=1,
        path=f"{path}",
    )
    options = {k.lower(): v for k, v in raw.items() if k not in _DESTINATION_KEYS}
    return Destination(
        name=name,
        transport=transport,
        options=options,
        uncertain=cast(UncertainPolicy, uncertain),
        max_attempts=attempts,
    )


def load(raw: Any) -> OutboxSettings:
    """Validate a raw ``DJANGO_OUTBOX`` value; raise ``ConfigurationError`` if wrong."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"{SETTING_NAME} must be a dict, got {type(raw).__name__}")
    unknown = set(raw) - set(DEFAULTS) - {"DESTINATIONS"}
    if unknown:
        raise ConfigurationError(
            f"{SETTING_NAME} has unknown keys: {', '.join(sorted(map(str, unknown)))}"
        )
    path = f"{SETTING_NAME}"
    max_attempts = _number(raw, "MAX_ATTEMPTS", int, minimum=1, path=f"{path}: ")
    raw_destinations = raw.get("DESTINATIONS", {})
    if not isinstance(raw_destinations, Mapping):
        raise ConfigurationError(f"{SETTING_NAME}['DESTINATIONS'] must be a dict")
    destinations = {
        name: _destination(name, value, max_attempts) for name, value in raw_destinations.items()
    }
    queue = raw.get("DELIVER_TASK_QUEUE", DEFAULTS["DELIVER_TASK_QUEUE"])
    if queue is not None and not isinstance(queue, str):
        raise ConfigurationError(f"{SETTING_NAME}['DELIVER_TASK_QUEUE'] must be a string or None")
    channel = raw.get("NOTIFY_CHANNEL", DEFAULTS["NOTIFY_CHANNEL"])
    if not isinstance(channel, str) or not channel.isidentifier():
        raise ConfigurationError(f"{SETTING_NAME}['NOTIFY_CHANNEL'] must be an identifier")
    in_background = raw.get("DISPATCH_IN_BACKGROUND", DEFAULTS["DISPATCH_IN_BACKGROUND"])
    if not isinstance(in_background, bool):
        raise ConfigurationError(f"{SETTING_NAME}['DISPATCH_IN_BACKGROUND'] must be True or False")
    dispatch = _choice(
        raw.get("DISPATCH", DEFAULTS["DISPATCH"]), DISPATCH_MODES, f"{SETTING_NAME}['DISPATCH']"
    )
    return OutboxSettings(
        destinations=destinations,
        max_payload_bytes=_number(raw, "MAX_PAYLOAD_BYTES", int, minimum=1, path=f"{path}: "),
        batch_size=_number(raw, "BATCH_SIZE", int, minimum=1, path=f"{path}: "),
        lease_seconds=_number(raw, "LEASE_SECONDS", float, minimum=0.1, path=f"{path}: "),
        retry_base_seconds=_number(raw, "RETRY_BASE_SECONDS", float, minimum=0, path=f"{path}: "),
        retry_max_seconds=_number(raw, "RETRY_MAX_SECONDS", float, minimum=0, path=f"{path}: "),
        max_attempts=max_attempts,
        retention_days=_number(raw, "RETENTION_DAYS", float, minimum=0, path=f"{path}: "),
        purge_batch_size=_number(raw, "PURGE_BATCH_SIZE", int, minimum=1, path=f"{path}: "),
        dispatch=cast(DispatchMode, dispatch),
        dispatch_in_background=in_background,
        dispatch_coalesce_seconds=_number(
            raw, "DISPATCH_COALESCE_SECONDS", float, minimum=0, path=f"{path}: "
        ),
        deliver_task_queue=queue,
        drain_seconds=_number(raw, "DRAIN_SECONDS", float, minimum=0, path=f"{path}: "),
        notify_channel=channel,
    )


_cached: OutboxSettings | None = None


def get_settings() -> OutboxSettings:
    """Return the current validated settings (cached until settings change)."""
    global _cached
    if _cached is None:
        _cached = load(getattr(django_settings, SETTING_NAME, None))
    return _cached


@receiver(setting_changed)
def _reset_on_change(*, setting: str, **kwargs: Any) -> None:
    global _cached
    if setting == SETTING_NAME:
        _cached = None
        from django_outbox.outbox.transports import registry

        registry.close_all()
