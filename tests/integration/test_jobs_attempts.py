"""Attempts count when a job starts, and what a dead worker's jobs become: the engine's
rules for jobs, in-process against the real database (a worker's death is its
heartbeat row going stale; the real SIGKILLs are in tests/acceptance)."""

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_outbox.engine import sweeps
from django_outbox.engine.models import Worker
from django_outbox.jobs.models import Job, JobState
from django_outbox.jobs.running import WORKER_LOST, Jobs, Running
from testproject.shop import jobs
from testproject.shop.models import Payment

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.jobs]


def left_running(result, *, started, attempts=0, worker=None):
    """Leave the job of *result* RUNNING under a worker that died: *started*, the
    worker had begun it (its attempt declared, not yet counted: it counts with its
    outcome, or with its rescue), else only claimed it."""
    worker = worker or uuid.uuid4()
    Job.objects.filter(result_id=result.id).update(
        state=JobState.RUNNING,
        lock_token=uuid.uuid4(),
        locked_until=timezone.now() + timedelta(seconds=60),
        claimed_by=worker,
        attempt_open=started,
        attempts=attempts,
    )
    return worker


def rescue(*dead):
    return sweeps.rescue_stuck(Running(), dead_workers=list(dead))


def test_a_claim_is_not_an_attempt_a_claimed_job_whose_worker_died_goes_back_uncounted():
    result = jobs.once.enqueue("claimed-only")
    worker = left_running(result, started=False)
    assert rescue(worker).ready == 1
    job = Job.objects.get()
    assert (job.state, job.attempts, job.errors, job.worker_ids) == (JobState.READY, 0, [], [])
    assert not job.unclean_end
    Jobs().drain()
    result.refresh()
    assert (result.status, result.attempts) == ("SUCCESSFUL", 1)


def test_the_rescue_uses_the_job_s_own_attempts_a_one_attempt_job_is_not_run_again():
    result = jobs.once.enqueue("died-in-it")  # max_attempts=1; the section allows 5
    worker = left_running(result, started=True)
    assert rescue(worker).held == 1
    job = Job.objects.get()
    assert job.state == JobState.FAILED
    assert job.finished_at is not None
    assert "gave up after 1 attempt" in job.last_error
    # The lost attempt is on the record: which worker ran it, and that it died.
    assert job.worker_ids == [str(worker)]
    assert [e["exception_class_path"] for e in job.errors] == [WORKER_LOST]
    assert Jobs().drain().claimed == 0
    assert not Payment.objects.exists()


def test_a_job_with_attempts_left_runs_again_at_once_after_its_worker_died():
    result = jobs.add.enqueue(1, 2)
    worker = left_running(result, started=True, attempts=0)
    assert rescue(worker).ready == 1
    job = Job.objects.get()
    assert (job.state, job.attempts, job.unclean_end) == (JobState.READY, 1, True)
    assert Jobs().drain().done == 1
    result.refresh()
    assert result.status == "SUCCESSFUL"
    assert result.attempts == 2
    assert result.worker_ids[0] == str(worker)
    assert [e.exception_class_path for e in result.errors] == [WORKER_LOST]
    assert not Job.objects.get().unclean_end


def test_a_serial_head_failed_by_the_rescue_holds_its_key():
    first = jobs.order_step.enqueue(order=7, step=1)  # max_attempts=1
    second = jobs.order_step.enqueue(order=7, step=2)
    worker = left_running(first, started=True)
    rescue(worker)
    head = Job.objects.get(result_id=first.id)
    assert (head.state, head.blocking) == (JobState.FAILED, True)
    assert Job.objects.get(result_id=second.id).blocked
    assert Jobs().drain().claimed == 0  # step 2 waits for an operator, not for nobody
    second.refresh()
    assert second.status == "READY"


def test_followers_of_a_serial_key_run_only_on_workers_of_their_queue():
    head = jobs.order_step.enqueue(order=8, step=1)  # default queue
    email = jobs.order_email.enqueue(order=8, step=2)  # emails queue, same key
    third = jobs.order_step.enqueue(order=8, step=3)  # default queue, behind the email
    assert Jobs(queues=["default"]).drain().done == 1
    for result in (head, email, third):
        result.refresh()
    assert (head.status, email.status, third.status) == ("SUCCESSFUL", "READY", "READY")
    assert Jobs(queues=["emails"]).drain().done == 1
    assert Jobs(queues=["default"]).drain().done == 1
    steps = list(Payment.objects.order_by("pk").values_list("order_ref", flat=True))
    assert steps == ["8:1", "8:2", "8:3"]


def test_results_of_different_json_types_recorded_in_one_group_stay_distinct():
    values = [True, 1, 1.0, "1", [1], [True], {"a": True}, {"a": 1}, None, False, 0]
    results = [jobs.echo.enqueue(value) for value in values]
    assert Jobs().drain().done == len(values)
    got = []
    for result in results:
        result.refresh()
        got.append(result.return_value)
    assert got == values
    assert [type(v) for v in got] == [type(v) for v in values]


def test_a_failing_job_does_not_cost_a_new_database_connection(settings):
    assert settings.DATABASES["default"]["CONN_MAX_AGE"] == 0
    for n in range(5):
        jobs.refuses.enqueue(n)  # raises ValueError: not retried
    connection.ensure_connection()
    before = connection.connection
    assert Jobs().drain().failed == 5
    assert connection.connection is before


def test_a_job_interrupted_from_the_keyboard_comes_back_at_once_uncounted():
    result = jobs.interrupted.enqueue()
    with pytest.raises(KeyboardInterrupt):
        Jobs().drain()
    job = Job.objects.get()
    assert (job.state, job.attempts, job.lock_token) == (JobState.READY, 0, None)
    assert result.id == str(job.result_id)


def test_a_worker_whose_heartbeat_is_stale_is_not_judged_dead_without_a_witness():
    """After a database outage every heartbeat is stale: nobody's rows are taken until
    some worker has beaten again for a whole timeout."""
    from django_outbox.engine import heartbeat

    now = timezone.now()
    stale = Worker.objects.create(
        id=uuid.uuid4(), name="a", heartbeat_at=now - timedelta(seconds=30), healthy_since=now
    )
    Worker.objects.create(id=uuid.uuid4(), name="b", heartbeat_at=now, healthy_since=now)
    assert heartbeat.dead_workers() == []  # b beats, but only since just now
    Worker.objects.filter(name="b").update(healthy_since=now - timedelta(seconds=10))
    assert heartbeat.dead_workers() == [stale.pk]
