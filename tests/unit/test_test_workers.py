"""The suite's two pytest-xdist workers never share a Redis database (``make test``)."""

from __future__ import annotations

import pytest

from testproject.settings import for_test_worker

REDIS = "redis://127.0.0.1:6379/"


@pytest.mark.parametrize(
    ("worker", "url", "expected"),
    [
        ("", f"{REDIS}14", f"{REDIS}14"),
        ("gw0", f"{REDIS}13", f"{REDIS}13"),
        ("gw0", f"{REDIS}14", f"{REDIS}14"),
        ("gw1", f"{REDIS}13", f"{REDIS}11"),
        ("gw1", f"{REDIS}14", f"{REDIS}12"),
        # A URL a test chose itself is left alone.
        ("gw1", f"{REDIS}10", f"{REDIS}10"),
        ("gw1", "redis://127.0.0.1:1/0", "redis://127.0.0.1:1/0"),
        ("gw1", "amqp://guest:guest@127.0.0.1:5672//", "amqp://guest:guest@127.0.0.1:5672//"),
        ("gw1", "filesystem://", "filesystem://"),
    ],
)
def test_each_worker_has_redis_databases_of_its_own(monkeypatch, worker, url, expected):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    assert for_test_worker(url) == expected


def test_the_two_workers_databases_are_disjoint(monkeypatch):
    taken = []
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        taken += [for_test_worker(f"{REDIS}13"), for_test_worker(f"{REDIS}14")]
    assert len(set(taken)) == 4
