"""Prometheus metrics scraped from real endpoints while real workers run: two relays
and a jobs worker share prometheus-client's multiprocess directory, and what one
endpoint serves matches the database afterwards; so does the per-minute table the
health page's chart reads."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
from django.db import transaction
from django.db.models import Sum
from prometheus_client.parser import text_string_to_metric_families

import django_outbox
from django_outbox.engine.models import MinuteCount
from django_outbox.jobs.models import Job, JobState
from django_outbox.models import OutboxMessage, OutboxState
from testproject.shop import jobs
from tests.acceptance.helpers import finish, read_as_it_comes, wait_for
from tests.conftest import ROOT, spawn_manage, subprocess_env

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.row_locks,
    pytest.mark.processes,
    pytest.mark.one_database,
    pytest.mark.jobs,
]

MESSAGES = 300
BROKEN_EVERY = 10  # one message in ten is refused for good by its transport
JOBS = 60


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample the endpoint on *port* serves, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def worker(command, port, multiproc_dir, *args):
    env = subprocess_env(PROMETHEUS_MULTIPROC_DIR=str(multiproc_dir))
    return read_as_it_comes(
        spawn_manage(command, "--interval", "0.05", "--metrics-port", str(port), *args, env=env)
    )


def test_scraped_counters_match_the_database_after_real_workers_ran(configure_outbox, tmp_path):
    configure_outbox(
        DESTINATIONS={"default": {"TRANSPORT": "tests.support.ScriptedTransport"}},
        MAX_ATTEMPTS=1,
        BATCH_SIZE=20,
    )
    with transaction.atomic():
        for n in range(MESSAGES):
            broken = n % BROKEN_EVERY == 0
            django_outbox.send("order.created", {"fail": "permanent"} if broken else {"n": n})
        for n in range(JOBS):
            jobs.add.enqueue(n, 1)
        for n in range(JOBS // 10):
            jobs.always_fails.enqueue(f"broken {n}")

    ports = [free_port() for _ in range(3)]
    processes = [
        worker("outbox_relay", ports[0], tmp_path),
        worker("outbox_relay", ports[1], tmp_path),
        worker("jobs_worker", ports[2], tmp_path),
    ]
    try:

        def finished():
            open_messages = OutboxMessage.objects.exclude(
                state__in=(OutboxState.SENT, OutboxState.SEND_ERROR)
            ).exists()
            open_jobs = Job.objects.exclude(
                state__in=(JobState.SUCCESSFUL, JobState.FAILED)
            ).exists()
            return not open_messages and not open_jobs

        wait_for(finished, timeout=60, what="every message and job to finish")
        sent = OutboxMessage.objects.filter(state=OutboxState.SENT).count()
        dead = OutboxMessage.objects.filter(state=OutboxState.SEND_ERROR).count()
        succeeded = Job.objects.filter(state=JobState.SUCCESSFUL).count()
        failed = Job.objects.filter(state=JobState.FAILED).count()
        assert (sent, dead) == (MESSAGES - MESSAGES // BROKEN_EVERY, MESSAGES // BROKEN_EVERY)
        assert (succeeded, failed) == (JOBS, JOBS // 10)

        # Any endpoint serves what every process of the directory counted.
        def counted():
            samples = scrape(ports[0])
            got = (
                value(samples, "django_outbox_outbox_sent_total", destination="default"),
                value(samples, "django_outbox_outbox_dead_lettered_total", destination="default"),
                value(samples, "django_outbox_jobs_succeeded_total", queue="default"),
                value(samples, "django_outbox_jobs_dead_lettered_total", queue="default"),
            )
            return samples if got == (sent, dead, succeeded, failed) else None

        samples = wait_for(counted, timeout=10, what="the scraped counters to match")
        # Each job attempt failed once or ran once: retried + final attempts.
        attempts = Job.objects.aggregate(n=Sum("attempts"))["n"]
        assert value(samples, "django_outbox_jobs_started_total", queue="default") == attempts
        assert value(samples, "django_outbox_jobs_retried_total", queue="default") == (
            attempts - succeeded - failed
        )
        assert value(
            samples, "django_outbox_outbox_publish_latency_seconds_count", destination="default"
        ) == (sent)
        assert value(samples, "django_outbox_jobs_run_duration_seconds_count", queue="default") == (
            attempts
        )
        assert all(p.poll() is None for p in processes)
    finally:
        outputs = [finish(p, signal.SIGTERM) for p in processes]

    # Stopped cleanly, each flushed its last counts: the chart's table agrees too.
    def minute_total(part, event):
        rows = MinuteCount.objects.filter(part=part, event=event)
        return rows.aggregate(n=Sum("count"))["n"] or 0

    assert minute_total("outbox", "done") == sent, outputs
    assert minute_total("outbox", "dead") == dead
    assert minute_total("jobs", "done") == succeeded
    assert minute_total("jobs", "dead") == failed


@pytest.mark.redis
def test_a_celery_prefork_pool_counts_in_its_children_and_a_scrape_sums_them(
    configure_outbox, queue_name, tmp_path, monkeypatch
):
    """Two prefork children deliver the on-commit triggers; what each counted is in the
    multiprocess directory, and a scrape of it (the web process's view) sums them."""
    from celery import current_app
    from celery.app.routes import Router, prepare

    from django_outbox import metrics

    # Small batches, a slow transport and a short drain budget: each task does little
    # and hands the rest on, so both children of the pool take part.
    configure_outbox(
        DESTINATIONS={
            "default": {"TRANSPORT": "tests.support.SlowTransport", "DELAY": 0.02},
            "broken": {"TRANSPORT": "tests.support.ScriptedTransport"},
        },
        DISPATCH="celery",
        DISPATCH_IN_BACKGROUND=False,
        MAX_ATTEMPTS=1,
        BATCH_SIZE=2,
        DRAIN_SECONDS=0.05,
    )
    app = current_app._get_current_object()
    routes = prepare({"django_outbox.*": {"queue": queue_name}})
    monkeypatch.setattr(
        app.amqp, "router", Router(routes, app.amqp.queues, create_missing=True, app=app)
    )
    env = subprocess_env(PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    celery = read_as_it_comes(
        subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "testproject", "worker"),
                *("--pool=prefork", "--concurrency=2", "-Q", queue_name),
                *("--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "WARNING"),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    )
    try:
        for n in range(40):  # one transaction, one trigger each: both children take some
            with transaction.atomic():
                if n % 8 == 0:
                    django_outbox.send("order.created", {"fail": "permanent"}, to="broken")
                else:
                    django_outbox.send("order.created", {"n": n})
        wait_for(
            lambda: (
                not OutboxMessage.objects.filter(
                    state__in=(OutboxState.SHOULD_BE_SENT, OutboxState.SENDING)
                ).exists()
            ),
            timeout=60,
            what="the Celery pool to deliver every message",
        )
        sent = OutboxMessage.objects.filter(state=OutboxState.SENT).count()
        dead = OutboxMessage.objects.filter(state=OutboxState.SEND_ERROR).count()
        assert (sent, dead) == (35, 5)

        # The web process's view of the same directory.
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
        monkeypatch.setattr(metrics, "_registry", None)
        from prometheus_client import generate_latest

        def scraped():
            text = generate_latest(metrics.registry()).decode()
            got = {}
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    got[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
            counts = (
                value(got, "django_outbox_outbox_sent_total", destination="default"),
                value(got, "django_outbox_outbox_dead_lettered_total", destination="broken"),
            )
            return counts == (sent, dead)

        wait_for(scraped, timeout=10, what="the multiprocess sums to match the database")
        # More than one process wrote counters (the pool's two children).
        assert len(list(tmp_path.glob("counter_*.db"))) >= 2
    finally:
        finish(celery, signal.SIGTERM)
        monkeypatch.setattr(metrics, "_registry", None)
