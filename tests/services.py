"""Reaching the real services: skip locally when one is down, fail in CI."""

from __future__ import annotations

import os
import socket
import time

import pytest

from testproject.settings import for_test_worker

SERVICES = {
    "postgres": ("127.0.0.1", 5432),
    "redis": ("127.0.0.1", 6379),
    "rabbitmq": ("127.0.0.1", 5672),
    "mariadb": ("127.0.0.1", 3306),
}

#: The Redis database tests may empty (this pytest-xdist worker's own: ``for_test_worker``).
REDIS_URL = for_test_worker(os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/13"))
AMQP_URL = os.environ.get("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def services_required() -> bool:
    """True in CI (``CI`` set) or when ``OUTBOX_REQUIRE_SERVICES=1``."""
    return bool(os.environ.get("CI")) or os.environ.get("OUTBOX_REQUIRE_SERVICES") == "1"


def require(name: str) -> None:
    """Fail (CI) or skip (locally) unless service *name* accepts TCP connections."""
    host, port = SERVICES[name]
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError as exc:
        message = f"{name} at {host}:{port} is not reachable ({exc})"
        if services_required():
            pytest.fail(message)
        pytest.skip(message)


def delete_rabbitmq_queue(name: str) -> None:
    """Delete queue *name* and the exchanges tests and Celery workers declare for it
    (``name``, ``name-ex``) if RabbitMQ is up."""
    try:
        socket.create_connection(SERVICES["rabbitmq"], timeout=1).close()
    except OSError:
        return
    from kombu import Connection

    with Connection(AMQP_URL, connect_timeout=2) as connection:
        channel = connection.default_channel
        channel.queue_delete(name)
        channel.exchange_delete(name)
        channel.exchange_delete(f"{name}-ex")


def crash_rabbitmq() -> None:
    """SIGKILL the RabbitMQ server (a crash: no clean shutdown, no flush)."""
    import subprocess

    subprocess.run(["pkill", "-KILL", "-f", "beam.smp.*rabbit"], check=False)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(SERVICES["rabbitmq"], timeout=0.2).close()
        except OSError:
            return
        time.sleep(0.05)
    raise AssertionError("RabbitMQ still accepts connections after SIGKILL")


def start_rabbitmq(timeout: float = 90) -> None:
    """Start RabbitMQ the way the machine does (``rabbitmq-server -detached``) unless it
    runs, and wait until it has finished booting."""
    import subprocess

    try:
        socket.create_connection(SERVICES["rabbitmq"], timeout=1).close()
    except OSError:
        subprocess.run(["rabbitmq-server", "-detached"], check=True)
    # await_startup gives up at once (status 69) while the node is not up yet.
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(
            ["rabbitmqctl", "await_startup", "--timeout", "30"], capture_output=True, text=True
        )
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"RabbitMQ did not start: {done.stdout}{done.stderr}")
        time.sleep(1)


def stop_rabbitmq_app() -> None:
    """Stop the RabbitMQ application cleanly (``rabbitmqctl stop_app``): clients get
    CONNECTION_FORCED, durable queues and persistent messages are kept, the node stays
    up for ``start_rabbitmq_app``."""
    import subprocess

    subprocess.run(["rabbitmqctl", "stop_app"], check=True, capture_output=True, timeout=60)


def start_rabbitmq_app(timeout: float = 90) -> None:
    """Start the RabbitMQ application again (``rabbitmqctl start_app``) and wait until it
    accepts connections; starts the whole server if the node is gone."""
    import subprocess

    done = subprocess.run(["rabbitmqctl", "start_app"], capture_output=True, timeout=120)
    if done.returncode != 0:
        start_rabbitmq(timeout)
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(SERVICES["rabbitmq"], timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(
                    "RabbitMQ did not accept connections after start_app"
                ) from None
            time.sleep(0.2)
