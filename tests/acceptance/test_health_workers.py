"""The health probe and ``outbox_stats`` against real worker processes: healthy while a
``jobs_worker`` runs the jobs; critical once it is SIGKILLed holding a job (its job
waits for a rescue that no live worker can make, and a new job waits for a worker);
healthy again when another worker has rescued and run them; a warning once a job is
dead-lettered (counted by the worker into the per-minute table)."""

from __future__ import annotations

import signal
import time

import pytest
from django.urls import reverse

from django_outbox.engine.models import MinuteCount, Worker
from django_outbox.jobs.models import Job, JobState
from testproject.shop import jobs
from tests.acceptance.helpers import finish, read_as_it_comes, wait_for
from tests.conftest import spawn_manage, subprocess_env

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.row_locks,
    pytest.mark.processes,
    pytest.mark.one_database,
    pytest.mark.jobs,
]

TOKEN = "h7Jd2kLq9XzP4vNc8RtY3wBm6QsF1aGe"


def jobs_worker(*args):
    return read_as_it_comes(
        spawn_manage("jobs_worker", "--interval", "0.1", *args, env=subprocess_env())
    )


def probe(client):
    """The probe's status code and body, as a load balancer would read them."""
    response = client.get(
        reverse("django_outbox_health:health"), HTTP_AUTHORIZATION=f"Bearer {TOKEN}"
    )
    return response.status_code, response.json()


def stats():
    """``outbox_stats`` in a process of its own: its exit code and first line."""
    process = spawn_manage("outbox_stats", "--no-failures")
    output, _ = process.communicate(timeout=60)
    return process.returncode, output


def not_ok(body):
    return {(c["part"], c["check"]): c["status"] for c in body["checks"] if c["status"] != "ok"}


def counted(event):
    return MinuteCount.objects.filter(part="jobs", event=event).exists()


def test_the_probe_and_the_command_follow_real_workers(client, configure_outbox, tmp_path):
    configure_outbox(HEALTH={"TOKEN": TOKEN, "NO_WORKER_SECONDS": 1.0})
    first = jobs_worker("--queue", "default", "--queue", "emails")
    second = None
    try:
        # Healthy: a live worker runs a job (and counts it into the per-minute table).
        jobs.add.enqueue(1, 2)
        wait_for(
            lambda: Job.objects.filter(state=JobState.SUCCESSFUL).exists(),
            timeout=60,
            what="the first worker to run a job",
        )
        wait_for(lambda: counted("done"), timeout=30, what="the worker to flush its counts")
        code, body = probe(client)
        assert (code, body["status"], not_ok(body)) == (200, "ok", {}), body
        assert body["parts"]["jobs"]["live_workers"] == 1
        (live,) = body["workers"]
        assert (live["role"], live["queues"], live["status"]) == (
            "jobs",
            ["default", "emails"],
            "alive",
        )
        assert body["parts"]["jobs"]["last_hour"]["done"] == 1
        exit_code, output = stats()
        assert exit_code == 0, output
        assert output.startswith("django-outbox OK: outbox, inbox, jobs healthy")

        # SIGKILLed while it runs a job, with another job enqueued behind it:
        marker = tmp_path / "started"
        jobs.slow.enqueue("killed", 60, str(marker))
        wait_for(marker.exists, timeout=60, what="the slow job to start")
        killed = Job.objects.get(state=JobState.RUNNING)
        finish(first, signal.SIGKILL)
        jobs.record_payment.enqueue("waits")
        timeout = 3.0  # WORKER_TIMEOUT_SECONDS
        time.sleep(timeout + 1.5)
        # critical: its job waits for a rescue nobody can make, the new one for a worker.
        code, body = probe(client)
        assert code == 503, body
        assert body["status"] == "critical"
        assert not_ok(body) == {("jobs", "workers"): "critical"}
        (check,) = [c for c in body["checks"] if c["status"] != "ok"]
        assert "1 row(s) of dead workers wait for a rescue" in check["message"]
        (dead,) = body["workers"]
        assert dead["status"] == "dead" and dead["id"] == str(killed.claimed_by)
        assert dead["holds"] == [
            {
                "part": "jobs",
                "rows": 1,
                "started": 1,
                "stuck": 1,
                "since": dead["holds"][0]["since"],
                "lease_ends": dead["holds"][0]["lease_ends"],
                "why_stuck": dead["holds"][0]["why_stuck"],
            }
        ]
        assert "has not beaten" in dead["holds"][0]["why_stuck"]
        exit_code, output = stats()
        assert exit_code == 2, output
        assert output.startswith("django-outbox CRITICAL: jobs: 1 row(s) of dead workers")
        assert ": dead, beat" in output and "holds 1 jobs row(s), 1 started" in output

        # Another worker starts: it rescues the killed job and runs both. Healthy again.
        second = jobs_worker()
        wait_for(
            lambda: Job.objects.filter(state=JobState.SUCCESSFUL).count() == 3,
            timeout=60,
            what="the second worker to rescue and run the jobs",
        )
        wait_for(
            lambda: not Worker.objects.filter(pk=killed.claimed_by).exists(),
            timeout=30,
            what="the dead worker's row to be removed by the rescue",
        )
        code, body = probe(client)
        assert (code, body["status"], not_ok(body)) == (200, "ok", {}), body
        assert stats()[0] == 0

        # A job that fails for good: dead-lettered, counted, a warning (still 200).
        jobs.refuses.enqueue(7)
        wait_for(
            lambda: Job.objects.filter(state=JobState.FAILED).exists(),
            timeout=60,
            what="the job to be dead-lettered",
        )
        wait_for(lambda: counted("dead"), timeout=30, what="the dead letter to be counted")
        code, body = probe(client)
        assert (code, body["status"]) == (200, "warning"), body
        assert not_ok(body) == {("jobs", "dead_lettered"): "warning"}
        exit_code, output = stats()
        assert exit_code == 1, output
        assert output.startswith(
            "django-outbox WARNING: jobs: 1 row(s) dead-lettered or held in the last 15 min"
        )
    finally:
        for worker in (first, second):
            if worker is not None and worker.poll() is None:
                finish(worker)
