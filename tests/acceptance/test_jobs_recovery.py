"""Jobs that must not wait and must not be charged, with real processes: no job waits
behind a long one while another worker of its queue is free; jobs a killed worker had
claimed but not started go back uncounted; a batch whose callback cannot be enqueued
takes no worker down; and through Celery a dead worker process's job runs again
within seconds, as with ``jobs_worker``."""

import os
import signal
import time

import pytest
from django.db import transaction
from django.utils import timezone

from django_outbox.jobs import batch
from django_outbox.jobs.models import Job, JobBatch, JobState
from django_outbox.jobs.running import WORKER_LOST
from testproject.shop import jobs
from testproject.shop.models import Payment
from tests.acceptance.helpers import (
    CeleryWorker,
    finish,
    start_command,
    wait_for,
    wait_for_workers,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.row_locks,
    pytest.mark.processes,
    pytest.mark.jobs,
]


def jobs_worker(*args, **env):
    return start_command("jobs_worker", "--json", "--interval", "0.1", *args, **env)


def test_no_job_waits_behind_a_long_one_while_another_worker_is_free(tmp_path):
    release = tmp_path / "release"
    workers = [jobs_worker(), jobs_worker()]
    try:
        wait_for_workers(2)
        with transaction.atomic():  # one claim takes them all: the long one first
            long = jobs.waits_for.enqueue("long", str(release))
            short = [jobs.record_payment.enqueue(f"short-{n}") for n in range(40)]
        short_jobs = Job.objects.filter(result_id__in=[r.id for r in short])
        # The long job runs until the test lets it end: the short ones must all finish
        # meanwhile, on the other worker, however slow this machine is. Well before the
        # 60 s lease of rows not handed back would run out and a sweep run them.
        wait_for(
            lambda: short_jobs.filter(state=JobState.SUCCESSFUL).count() == 40,
            timeout=30,
            what="the short jobs to finish while the long one runs",
        )
        long_job = Job.objects.get(result_id=long.id)
        assert long_job.state == JobState.RUNNING
        release.touch()
        wait_for(
            lambda: Job.objects.filter(state=JobState.SUCCESSFUL).count() == 41,
            timeout=60,
            what="the long job to finish",
        )
    finally:
        release.touch()  # else a worker stuck in the long job outlasts finish()'s wait
        outputs = [finish(w) for w in workers]
    long_job.refresh_from_db()
    assert all(j.worker_ids[0] != long_job.worker_ids[0] for j in short_jobs), outputs
    assert all(j.attempts == 1 for j in short_jobs)  # handed back uncounted


def test_jobs_a_killed_worker_had_claimed_but_not_started_go_back_uncounted(tmp_path):
    marker = tmp_path / "started"
    with transaction.atomic():
        first = jobs.slow.enqueue("first", 60, str(marker))
        rest = [jobs.record_payment.enqueue(f"rest-{n}") for n in range(30)]
    doomed = jobs_worker()
    try:
        wait_for(marker.exists, timeout=60, what="the first job to start")
        # The worker claimed the whole batch; it started only the first.
        assert Job.objects.filter(state=JobState.RUNNING).count() == 31
    finally:
        finish(doomed, signal.SIGKILL)
    survivor = jobs_worker()
    try:
        wait_for(
            lambda: Job.objects.filter(state=JobState.SUCCESSFUL).count() == 31,
            timeout=60,
            what="the survivor to run every job",
        )
    finally:
        finish(survivor)
    first.refresh()
    assert first.attempts == 2  # the killed attempt counted, with its worker lost
    assert [e.exception_class_path for e in first.errors] == [WORKER_LOST]
    for result in rest:
        result.refresh()
        assert (result.attempts, result.errors) == (1, []), result.id
    assert Payment.objects.count() == 31


def test_a_batch_whose_callback_cannot_be_enqueued_takes_no_worker_down():
    with batch(on_finish=jobs.batch_done, tag="broken") as broken:
        jobs.record_payment.enqueue("in-broken")
    with batch(on_finish=jobs.batch_done, tag="fine"):
        jobs.record_payment.enqueue("in-fine")
    # The callback's task was renamed in a deploy since.
    JobBatch.objects.filter(batch_id=broken.id).update(
        callback_path="testproject.shop.jobs.renamed_away"
    )
    worker = jobs_worker("--sweep-interval", "0.5")
    try:
        wait_for(
            lambda: Payment.objects.filter(order_ref="batch:fine").exists(),
            timeout=60,
            what="the good batch's callback",
        )
        wait_for(
            lambda: JobBatch.objects.get(batch_id=broken.id).last_error,
            timeout=30,
            what="the broken batch's error to be recorded",
        )
        time.sleep(1.5)  # a few more sweeps: the worker lives on
        assert worker.poll() is None
        jobs.record_payment.enqueue("after")
        wait_for(
            lambda: Payment.objects.filter(order_ref="after").exists(),
            timeout=30,
            what="a later job to run",
        )
        # Fixed: the next sweep completes it.
        JobBatch.objects.filter(batch_id=broken.id).update(
            callback_path="testproject.shop.jobs.batch_done"
        )
        wait_for(
            lambda: JobBatch.objects.get(batch_id=broken.id).finished_at,
            timeout=30,
            what="the broken batch to complete once fixed",
        )
    finally:
        output = finish(worker)
    broken_row = JobBatch.objects.get(batch_id=broken.id)
    assert broken_row.last_error == ""
    assert "renamed_away" in output
    assert worker.returncode == 0, output


@pytest.mark.redis
def test_through_celery_a_dead_worker_process_s_job_runs_again_within_seconds(
    configure_outbox, queue_name, tmp_path
):
    configure_outbox(
        DISPATCH="celery",
        DISPATCH_IN_BACKGROUND=False,
        JOBS={"CELERY_QUEUES": {"default": queue_name}},
    )
    marker = tmp_path / "started"
    celery = CeleryWorker(queue_name, concurrency=2)
    try:
        time.sleep(5)  # the pool's processes beat from their start
        result = jobs.slow.enqueue("celery-killed", 60, str(marker))
        wait_for(marker.exists, timeout=60, what="the job to start in a pool process")
        os.kill(int(marker.read_text()), signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(
            lambda: Job.objects.filter(state=JobState.SUCCESSFUL).exists(),
            timeout=60,
            what="the job to run again",
        )
        took = time.monotonic() - killed_at
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the worker said:\n{celery.output()[-3000:]}") from None
    finally:
        celery.stop()
    result.refresh()
    assert result.attempts == 2
    assert [e.exception_class_path for e in result.errors] == [WORKER_LOST]
    assert took < 10, f"ran again {took:.1f}s after its worker process died"


def test_sigterm_stops_a_jobs_worker_after_the_job_in_hand():
    """SIGTERM ends the worker after the job it is running, not after its whole batch
    (up to BATCH_SECONDS) and drain: the jobs it had not started go back at once."""
    with transaction.atomic():
        for n in range(40):
            jobs.slow.enqueue(f"t-{n}", 0.25)
    worker = jobs_worker()
    try:
        wait_for(
            lambda: Job.objects.filter(state=JobState.SUCCESSFUL).count() >= 2,
            timeout=60,
            what="a few jobs to run",
        )
        before = time.monotonic()
        asked_at = timezone.now()
        os.kill(worker.pid, signal.SIGTERM)
        gap = time.monotonic() - before
        worker.wait(timeout=30)
    finally:
        output = finish(worker)
    assert worker.returncode == 0, output
    # Each job writes its Payment as it ends. After the signal only the job in hand may
    # end; before it, between reading the clock and signalling, one job a 0.25 s. A
    # worker that finished its batch would run on to BATCH_SECONDS (a batch starts up to
    # 2 s / 0.25 s = 8 jobs); one that drained on, all 40. Counted, not timed: a slow
    # machine runs fewer jobs after the signal, not more.
    after = Payment.objects.filter(handled_at__gt=asked_at).count()
    assert after <= 2 + int(gap / 0.25), f"{after} jobs ended after SIGTERM\n{output}"
    assert not Job.objects.filter(state=JobState.RUNNING).exists()
    left = Job.objects.filter(state=JobState.READY)
    assert left.exists() and set(left.values_list("attempts", flat=True)) == {0}
