"""System checks for the ``DJANGO_OUTBOX`` setting and the ``TASKS`` entries of our backend."""

from __future__ import annotations

import difflib
import importlib.metadata
import importlib.util
from collections.abc import Mapping
from typing import Any

import django
from django.conf import settings
from django.core import checks
from django.db import connections
from django.utils.module_loading import import_string

from django_outbox.conf import SETTING_NAME, Settings, load, suggest
from django_outbox.exceptions import ConfigurationError

#: The unrelated project that owns the name ``django-outbox`` on the package
#: index; it installs a module called ``django_outbox`` too.
FOREIGN_DISTRIBUTION = "django-outbox"


def _check_distribution() -> list[checks.CheckMessage]:
    try:
        foreign = importlib.metadata.distribution(FOREIGN_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return []
    return [
        checks.Error(
            f"the package {FOREIGN_DISTRIBUTION!r} {foreign.version} is installed: it is an "
            "unrelated project that writes files into the same 'django_outbox' module",
            hint=f"pip uninstall {FOREIGN_DISTRIBUTION}, then pip install --force-reinstall "
            "django-outbox-inbox",
            id="django_outbox.E004",
        )
    ]


def _check_celery(config: Settings) -> list[checks.CheckMessage]:
    if config.dispatch != "celery":
        return []
    from celery import current_app

    from django_outbox.engine.triggers import celery_app_missing

    app: Any = current_app._get_current_object()  # type: ignore[attr-defined]
    if celery_app_missing(app):
        # A warning, not an error: nothing is lost (the messages wait in their table for
        # a worker), and an error would stop `migrate` in a project that has not set
        # up Celery yet. The first trigger without an app is also logged as an error.
        return [
            checks.Warning(
                f"{SETTING_NAME}['DISPATCH'] is 'celery' (the default) but no Celery app is "
                "loaded: on-commit triggers would go to Celery's default app "
                "(amqp://guest@localhost), so nothing delivers messages, handles the inbox "
                "or runs jobs until a Celery app (with beat) or a worker command does",
                hint="Define your Celery app (proj/celery.py) and import it in proj/__init__.py "
                "as the quickstart shows, with CELERY_BROKER_URL set; or, without Celery, set "
                "DISPATCH to 'notify' (PostgreSQL) or 'none' and run outbox_relay.",
                id="django_outbox.W004",
            )
        ]
    if not (app.conf.broker_url or app.conf.broker_write_url):
        return [
            checks.Warning(
                f"the Celery app {app.main!r} has no broker URL: on-commit triggers go to "
                "amqp://guest@localhost",
                hint="Set CELERY_BROKER_URL (with app.config_from_object('django.conf:settings', "
                "namespace='CELERY')).",
                id="django_outbox.W005",
            )
        ]
    return []


def _check_signatures(config: Settings) -> list[checks.CheckMessage]:
    return [
        checks.Warning(
            f"inbox source {source.name!r} accepts v1 webhook signatures (ACCEPT_V1), which "
            "do not cover the envelope: a request captured within TOLERANCE_SECONDS can be "
            "replayed under a new message id, type, key or sequence",
            hint="Upgrade the senders (they sign v2), then remove ACCEPT_V1.",
            id="django_outbox.W020",
        )
        for source in config.inbox.sources.values()
        if source.transport == "webhook" and source.options.get("accept_v1")
    ]


#: A ``HEALTH['TOKEN']`` shorter than this is reported (W021).
HEALTH_TOKEN_MIN_CHARS = 32


def _check_health(config: Settings) -> list[checks.CheckMessage]:
    token = config.health.token
    if not token or len(token) >= HEALTH_TOKEN_MIN_CHARS:
        return []
    return [
        checks.Warning(
            f"{SETTING_NAME}['HEALTH']['TOKEN'] is {len(token)} characters long: whoever "
            "guesses it reads the health probe's figures (names of destinations, sources, "
            "tasks and workers, and error texts)",
            hint=f"Use at least {HEALTH_TOKEN_MIN_CHARS} random characters, e.g. "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))'.",
            id="django_outbox.W021",
        )
    ]


#: Above this many seconds between probes, a destination that came back waits long
#: for its backlog to move.
CIRCUIT_PROBE_MAX_WARNING_SECONDS = 30.0


def _check_circuits(config: Settings) -> list[checks.CheckMessage]:
    outbox = config.outbox
    if not outbox.circuit_breaker or (
        outbox.circuit_probe_max_seconds <= CIRCUIT_PROBE_MAX_WARNING_SECONDS
    ):
        return []
    return [
        checks.Warning(
            f"{SETTING_NAME}['OUTBOX']['CIRCUIT_PROBE_MAX_SECONDS'] is "
            f"{outbox.circuit_probe_max_seconds:g}: after a long outage a destination that "
            "is back waits up to that long before its messages move",
            hint="A probe is one connection attempt per relay and destination; a few "
            "seconds (the default is 2) cost nothing.",
            id="django_outbox.W023",
        )
    ]


#: The jobs backend, as ``TASKS`` names it (the second spelling is its module's).
JOBS_BACKEND = "django_outbox.jobs.JobsBackend"
_JOBS_BACKEND_PATHS = (JOBS_BACKEND, "django_outbox.jobs.backend.JobsBackend")


def tasks_api() -> str | None:
    """The Tasks API this environment has (``django.tasks`` on Django 6, else the
    ``django_tasks`` backport), found without importing it; ``None`` without one."""
    for name in ("django.tasks", "django_tasks"):
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except (ImportError, ValueError):
            continue
    return None


def _check_tasks() -> list[checks.CheckMessage]:
    """``TASKS`` entries that mean our backend: it needs a Tasks API (E006), and a
    misspelt path would only fail at the first ``enqueue`` (E007)."""
    raw = getattr(settings, "TASKS", None)
    if not isinstance(raw, Mapping):
        return []
    api = tasks_api()
    problems: list[checks.CheckMessage] = []
    ours: list[str] = []
    for alias, params in raw.items():
        path = params.get("BACKEND") if isinstance(params, Mapping) else None
        if not isinstance(path, str):
            continue
        if path in _JOBS_BACKEND_PATHS:
            ours.append(str(alias))
            continue
        close = difflib.get_close_matches(path, [JOBS_BACKEND], n=1, cutoff=0.8)
        if not (path.startswith("django_outbox.") or close):
            continue  # another library's backend: the Tasks API checks its own
        reason = "is not django-outbox's jobs backend"
        if api is not None:
            try:
                found = import_string(path)
            except ImportError as exc:
                reason = f"cannot be imported ({exc})"
            else:
                from django_outbox.jobs.backend import JobsBackend

                if isinstance(found, type) and issubclass(found, JobsBackend):
                    ours.append(str(alias))
                    continue
                reason = "is not a task backend"
        problems.append(
            checks.Error(
                f"TASKS[{alias!r}]['BACKEND'] is {path!r}, which {reason}: enqueuing a job "
                "on it would fail",
                hint=f"Set it to {JOBS_BACKEND!r}.",
                id="django_outbox.E007",
            )
        )
    if ours and api is None:
        problems.append(
            checks.Error(
                f"TASKS[{', '.join(map(repr, ours))}] uses {JOBS_BACKEND!r}, but there is no "
                f"Tasks API here: Django {django.get_version()} has no django.tasks (Django "
                "6.0+) and the django-tasks backport is not installed, so jobs can be "
                "neither enqueued nor run",
                hint="pip install 'django-outbox-inbox[jobs]' (the django-tasks backport for "
                "Django 5.2), then restart the web processes and every worker.",
                id="django_outbox.E006",
            )
        )
    return problems


def _check_sources(config: Settings) -> list[checks.CheckMessage]:
    """The two halves of a local loop, and replies, name each other correctly."""
    from django_outbox.outbox.transports.local import local_sources

    sources = config.inbox.sources
    destinations = config.outbox.destinations
    delivered = local_sources(destinations.values())
    where = f"{SETTING_NAME}['INBOX']['SOURCES']"
    problems: list[checks.CheckMessage] = []
    for name, senders in sorted(delivered.items()):
        by = ", ".join(map(repr, senders))
        source = sources.get(name)
        if source is None:
            problems.append(
                checks.Warning(
                    f"outbox destination {by} (local transport) delivers into the inbox "
                    f"source {name!r}, which is not declared in {where}: its messages are "
                    "handled, but the source has no settings (REPLY_TO …) and is missing "
                    "where sources are listed",
                    hint=f"Add {name!r}: {{'TRANSPORT': 'local'}} to {where}.",
                    id="django_outbox.W006",
                )
            )
        elif source.transport != "local":
            problems.append(
                checks.Error(
                    f"outbox destination {by} (local transport) delivers into the inbox "
                    f"source {name!r}, which is a {source.transport} source: this service's "
                    "own messages would share its message ids and ordering cursors with "
                    "another producer's",
                    hint=f"Give the destination a SOURCE of its own, declared in {where} "
                    "with 'TRANSPORT': 'local'.",
                    id="django_outbox.E008",
                )
            )
    for name, source in sorted(sources.items()):
        if source.transport == "local" and name not in delivered:
            others = ", ".join(map(repr, sorted(delivered)))
            problems.append(
                checks.Warning(
                    f"{where}[{name!r}] is a local source, but no outbox destination with "
                    "the local transport delivers into it"
                    + (f" (they deliver into {others})" if others else "")
                    + ": nothing will arrive there",
                    hint=f"Set 'SOURCE': {name!r} on the local destination meant for it, or "
                    f"add one: {{'TRANSPORT': 'local', 'SOURCE': {name!r}}}.",
                    id="django_outbox.W007",
                )
            )
        reply_to = source.options.get("reply_to")
        if reply_to is not None and reply_to not in destinations:
            problems.append(
                checks.Error(
                    f"{where}[{name!r}]['REPLY_TO'] is {reply_to!r}, which is not an outbox "
                    f"destination{suggest(reply_to, destinations)}: every reply to a request "
                    "from this source would fail (handle_error)",
                    hint="Name one of the destinations in "
                    f"{SETTING_NAME}['OUTBOX']['DESTINATIONS'] "
                    f"({', '.join(sorted(destinations)) or 'none'}), or add it there.",
                    id="django_outbox.E009",
                )
            )
    return problems


@checks.register("django_outbox")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Validate ``DJANGO_OUTBOX`` and every destination's transport options."""
    from django_outbox.outbox.transports.registry import transport_class

    try:
        config = load(getattr(settings, SETTING_NAME, None))
    except ConfigurationError as exc:
        return [checks.Error(str(exc), id="django_outbox.E001"), *_check_tasks()]
    problems: list[checks.CheckMessage] = _check_distribution()
    problems += _check_celery(config)
    problems += _check_tasks()
    problems += _check_sources(config)
    outbox = config.outbox
    if not outbox.destinations:
        problems.append(
            checks.Warning(
                f"{SETTING_NAME}['OUTBOX']['DESTINATIONS'] is empty: send() will refuse every "
                "message",
                id="django_outbox.W001",
            )
        )
    for destination in outbox.destinations.values():
        try:
            cls = transport_class(destination)
        except ConfigurationError as exc:
            problems.append(checks.Error(str(exc), id="django_outbox.E002"))
            continue
        problems.extend(cls.check(destination))
    problems += _check_signatures(config)
    problems += _check_health(config)
    problems += _check_circuits(config)
    for alias in connections:
        connection = connections[alias]
        mode = str(connection.settings_dict.get("OPTIONS", {}).get("transaction_mode", ""))
        if connection.vendor == "sqlite" and mode.upper() != "IMMEDIATE":
            problems.append(
                checks.Warning(
                    f"database {alias!r} is SQLite without OPTIONS['transaction_mode'] = "
                    "'IMMEDIATE': a relay claiming while another process writes can fail "
                    "with 'database is locked'",
                    hint='Add "OPTIONS": {"transaction_mode": "IMMEDIATE"}; use PostgreSQL '
                    "in production.",
                    id="django_outbox.W003",
                )
            )
    if config.dispatch == "notify" and connections["default"].vendor != "postgresql":
        problems.append(
            checks.Warning(
                f"{SETTING_NAME}['DISPATCH'] is 'notify' but the database is not PostgreSQL; "
                "outbox_relay will poll instead",
                id="django_outbox.W002",
            )
        )
    return problems


@checks.register("django_outbox", checks.Tags.database)
def check_databases(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Databases the engine claims from must have ``SKIP LOCKED`` (asks the server, so it
    runs only where Django runs database checks: ``migrate``, ``check --database``)."""
    problems: list[checks.CheckMessage] = []
    for alias in databases or ():
        connection = connections[alias]
        features = connection.features
        if connection.vendor != "sqlite" and not features.has_select_for_update_skip_locked:
            problems.append(
                checks.Error(
                    f"database {alias!r} ({connection.vendor}) has no SELECT … FOR UPDATE "
                    "SKIP LOCKED, which the relay's claims need",
                    hint="Use PostgreSQL, MariaDB 10.6+ or MySQL 8.0+.",
                    id="django_outbox.E003",
                )
            )
    return problems


@checks.register("django_outbox")
def check_kill_points(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn whenever a kill point is armed: that process SIGKILLs itself on purpose."""
    from django_outbox.engine import faults

    armed = faults.armed()
    if armed is None:
        return []
    return [
        checks.Warning(
            f"{faults.ENVIRONMENT} is set ({armed}): this process KILLS ITSELF with SIGKILL "
            "when it reaches that step. Kill points are for django-outbox's crash tests only",
            hint=f"Unset {faults.ENVIRONMENT} in every production environment (web, workers, "
            "beat, cron).",
            id="django_outbox.W022",
        )
    ]
