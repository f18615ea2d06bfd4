from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection, transaction

from django_outbox.engine import heartbeat, telemetry
from django_outbox.outbox.transports import memory, registry
from testproject.settings import for_test_worker
from tests import services

ROOT = Path(__file__).resolve().parent.parent

BASE_OUTBOX: dict[str, Any] = {
    "OUTBOX": {
        "DESTINATIONS": {
            "default": {"TRANSPORT": "memory"},
            "held": {"TRANSPORT": "memory", "UNCERTAIN": "hold"},
        },
    },
    "DISPATCH": "none",
    "BATCH_SIZE": 100,
    "RETRY_BASE_SECONDS": 1.0,
    "RETRY_MAX_SECONDS": 60.0,
    "MAX_ATTEMPTS": 5,
}


#: Keys ``configure_outbox`` puts in the ``OUTBOX`` section.
OUTBOX_SECTION_KEYS = frozenset(
    {
        "DESTINATIONS",
        "MAX_PAYLOAD_BYTES",
        "CIRCUIT_BREAKER",
        "CIRCUIT_PROBE_SECONDS",
        "CIRCUIT_PROBE_MAX_SECONDS",
    }
)


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    engine = django_settings.DATABASES["default"]["ENGINE"]
    missing = {
        "postgres": "postgresql" not in engine,
        "row_locks": "sqlite" in engine,
    }
    reasons = {
        "postgres": "needs PostgreSQL (LISTEN/NOTIFY, EXPLAIN): set DATABASE_URL=postgres://…",
        "row_locks": "needs a database several processes can claim from (PostgreSQL or "
        "MariaDB): set DATABASE_URL",
    }
    if not PARTITIONED:
        missing["partitioned"] = True
        reasons["partitioned"] = (
            "needs the tables partitioned: DJANGO_OUTBOX_TEST_PARTITIONED=1 on PostgreSQL "
            "(make test-partitioned)"
        )
    for item in items:
        for marker, absent in missing.items():
            if absent and marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reasons[marker]))


#: ``make test-partitioned``: the test database's three tables are partitioned
#: (``outbox_partition convert``) before any test runs.
PARTITIONED = os.environ.get("DJANGO_OUTBOX_TEST_PARTITIONED") == "1"


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: Any, django_db_blocker: Any) -> None:
    from django.core.management import call_command

    from django_outbox.engine import partitions
    from django_outbox.models import InboxMessage, Job, OutboxMessage

    engine = django_settings.DATABASES["default"]["ENGINE"]
    with django_db_blocker.unblock():
        if PARTITIONED:
            assert "postgresql" in engine, "DJANGO_OUTBOX_TEST_PARTITIONED needs PostgreSQL"
            call_command("outbox_partition", "convert", "--ahead", "5", stdout=io.StringIO())
        # Each process reads a table's layout once (a catalog query on PostgreSQL):
        # read now, so that no test counting its queries sees it.
        for model in (OutboxMessage, InboxMessage, Job):
            partitions.layout(model, "default")


#: The Redis database ``make test`` gives Celery as its broker; emptied after the run.
TEST_CELERY_BROKER = "redis://127.0.0.1:6379/14"


@pytest.fixture(scope="session", autouse=True)
def empty_the_test_celery_broker_afterwards() -> Iterator[None]:
    yield
    if os.environ.get("CELERY_BROKER_URL") == for_test_worker(TEST_CELERY_BROKER):
        import redis

        try:
            # This worker's own database (``for_test_worker``), never the other's.
            broker = django_settings.CELERY_BROKER_URL
            client = redis.Redis.from_url(broker, socket_connect_timeout=1)
            client.flushdb()
            client.close()
        except redis.RedisError:
            pass


@pytest.fixture(autouse=True)
def outbox_settings(settings: Any) -> Iterator[dict[str, Any]]:
    """Every test starts with in-memory destinations and no automatic dispatch."""
    settings.DJANGO_OUTBOX = json.loads(json.dumps(BASE_OUTBOX))
    memory.clear()
    yield settings.DJANGO_OUTBOX
    registry.close_all()
    memory.clear()


@pytest.fixture(autouse=True)
def no_timed_telemetry_flush(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The per-minute tally is flushed when a test says so, never because 5 s have passed.

    Otherwise a flush lands, now and then, inside a test that counts its queries.
    """
    monkeypatch.setattr(telemetry, "FLUSH_SECONDS", 3600.0)
    telemetry.discard()
    yield
    telemetry.discard()


@pytest.fixture(autouse=True)
def no_heartbeat_outlives_its_test() -> Iterator[None]:
    """A process heartbeat a test started stops with it.

    A Celery task run the way a worker runs it starts this process's heartbeat
    (``heartbeat.start_for_task``). Left running, it would tend, renew and hand back
    the claims of the tests after it, and write beside their transactions.
    """
    yield
    if heartbeat.current() is not None:
        heartbeat.stop()


@pytest.fixture
def configure_outbox(settings: Any) -> Callable[..., dict[str, Any]]:
    """Replace parts of ``DJANGO_OUTBOX``: ``configure_outbox(DESTINATIONS={...}, ...)``."""

    def apply(**overrides: Any) -> dict[str, Any]:
        value = json.loads(json.dumps(BASE_OUTBOX))
        for key, setting in overrides.items():
            if key in OUTBOX_SECTION_KEYS:  # the outbox's own keys live in its section
                value["OUTBOX"][key] = setting
            else:
                value[key] = setting
        settings.DJANGO_OUTBOX = value
        return value

    return apply


@pytest.fixture
def redis_url() -> Iterator[str]:
    """The test Redis database, empty at the start and emptied again at the end."""
    services.require("redis")
    import redis

    client = redis.Redis.from_url(services.REDIS_URL)
    client.flushdb()
    yield services.REDIS_URL
    client.flushdb()
    client.close()


@pytest.fixture
def amqp_url() -> str:
    services.require("rabbitmq")
    return services.AMQP_URL


@pytest.fixture
def queue_name() -> Iterator[str]:
    """A fresh queue name; the RabbitMQ queue of that name is deleted afterwards."""
    name = f"outbox-test-{uuid.uuid4().hex[:12]}"
    yield name
    services.delete_rabbitmq_queue(name)


def test_database_url() -> str:
    """A URL for the database the current test runs against (for subprocesses)."""
    params = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{params['NAME']}"
    scheme, default_user, default_port = {
        "postgresql": ("postgres", "postgres", 5432),
        "mysql": ("mysql", "root", 3306),
    }[connection.vendor]
    user = params.get("USER") or default_user
    password = f":{params['PASSWORD']}" if params.get("PASSWORD") else ""
    host = params.get("HOST") or "127.0.0.1"
    port = params.get("PORT") or default_port
    return f"{scheme}://{user}{password}@{host}:{port}/{params['NAME']}"


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a ``manage.py`` child sharing this test's database and outbox settings."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=test_database_url(),
        OUTBOX_SETTINGS_JSON=json.dumps(django_settings.DJANGO_OUTBOX),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def spawn_manage(
    *args: str, env: dict[str, str] | None = None, **kwargs: Any
) -> subprocess.Popen[str]:
    """Start ``manage.py *args`` as a child process."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env or subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kwargs,
    )


@contextmanager
def row_held_elsewhere(queryset: Any, seconds: float = 1.0) -> Iterator[None]:
    """Another transaction (a thread with its own connection) holds the rows of
    *queryset* locked ``FOR UPDATE`` while the block runs, and for at most *seconds*:
    what a claim scanning the table, or another batch, does to a row it passes."""
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                list(queryset.select_for_update())
                held.set()
                done.wait(timeout=seconds)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(timeout=10), "the other transaction could not lock the rows"
        yield
    finally:
        done.set()
        holder.join()
