"""System checks for the ``DJANGO_OUTBOX`` setting."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections

from django_outbox.conf import SETTING_NAME, Settings, load
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
        return [
            checks.Error(
                f"{SETTING_NAME}['DISPATCH'] is 'celery' (the default) but no Celery app is "
                "loaded: on-commit triggers would go to Celery's default app "
                "(amqp://guest@localhost) and the beat sweeps would not run",
                hint="Define your Celery app (proj/celery.py) and import it in proj/__init__.py "
                "as the quickstart shows, with CELERY_BROKER_URL set; or set DISPATCH to "
                "'notify' (PostgreSQL, with outbox_relay) or 'none'.",
                id="django_outbox.E005",
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


def _check_sources(config: Settings) -> list[checks.CheckMessage]:
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


@checks.register("django_outbox")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Validate ``DJANGO_OUTBOX`` and every destination's transport options."""
    from django_outbox.outbox.transports.registry import transport_class

    try:
        config = load(getattr(settings, SETTING_NAME, None))
    except ConfigurationError as exc:
        return [checks.Error(str(exc), id="django_outbox.E001")]
    problems: list[checks.CheckMessage] = _check_distribution()
    problems += _check_celery(config)
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
    problems += _check_sources(config)
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
