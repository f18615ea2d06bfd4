"""What a task does to the process that runs it: ``SystemExit``, ``sys.exit()``,
``KeyboardInterrupt`` and a task that kills its worker, with a real
``manage.py jobs_worker``.

These re-express, for our database backend, the contract that Django's own
tests state (read from Django 6.1.3's ``tests/tasks/test_immediate_backend.py``:
``SystemExit`` is the task's failure, ``KeyboardInterrupt`` goes through);
they run on Django 6.1 and on Django 5.2 with the ``django-tasks`` backport.
Ours adds what a worker process owes its jobs: it goes on after a task exits,
and gives a job back at once when it is interrupted.
"""

import os
import signal
import threading
import time

import pytest

from django_outbox.jobs import compat
from django_outbox.jobs.models import Job, JobState
from tests.acceptance.helpers import wait_for
from tests.conformance import tasks
from tests.conftest import spawn_manage, subprocess_env

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.row_locks,
    pytest.mark.processes,
    pytest.mark.jobs,
]

WORKER_LOST = "django_outbox.jobs.WorkerLost"


def start_worker(*args):
    """A ``jobs_worker`` whose output is collected as it comes (a full pipe would stall
    it); ``.output()`` is what it printed so far."""
    process = spawn_manage(
        "jobs_worker", "--interval", "0.1", "--no-listen", *args, env=subprocess_env()
    )
    lines: list[str] = []

    def read():
        for line in process.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    process.output = lambda: "".join(lines)
    process.reader = reader
    return process


def stop_worker(process, timeout=20):
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
    process.wait(timeout=timeout)
    process.reader.join(timeout=timeout)
    return process.output()


def finished(*results):
    def check():
        for result in results:
            result.refresh()
        return all(result.is_finished for result in results)

    return check


def test_system_exit_and_sys_exit_fail_their_task_and_the_worker_goes_on():
    exits = tasks.raises_system_exit.enqueue()
    calls_exit = tasks.calls_exit.enqueue()
    worker = start_worker()
    try:
        wait_for(finished(exits, calls_exit), timeout=60, what="both exiting jobs to be recorded")
        after = tasks.answer.enqueue()  # a job enqueued later still runs: the worker lives
        wait_for(finished(after), timeout=30, what="the next job to run")
        alive = worker.poll() is None
    finally:
        output = stop_worker(worker)
    assert alive, output
    assert worker.returncode == 0, output
    endings = {
        exits.id: "SystemExit: the task raised SystemExit\n",
        calls_exit.id: "SystemExit: 1\n",
    }
    for result in (exits, calls_exit):
        assert result.status == compat.TaskResultStatus.FAILED
        assert result.attempts == 1  # not retried
        [error] = result.errors
        assert error.exception_class is SystemExit
        assert error.traceback.endswith(endings[result.id])
    assert after.return_value == 42


def test_keyboard_interrupt_stops_the_worker_and_its_jobs_are_ready_at_once():
    """A task that raises ``KeyboardInterrupt`` ends its worker (as Django lets it end
    the process); the job and the rest of its batch are READY again as the worker
    exits, their attempts not counted, not after their lease."""
    interrupted = tasks.raises_keyboard_interrupt.using(priority=10).enqueue()
    behind = [tasks.nothing.enqueue(n) for n in range(3)]
    worker = start_worker("--batch", "10")
    try:
        worker.wait(timeout=60)
        stopped_at = time.monotonic()
    finally:
        output = stop_worker(worker)
    assert worker.returncode != 0, output
    assert "KeyboardInterrupt" in output
    jobs = {str(job.result_id): job for job in Job.objects.all()}
    assert time.monotonic() - stopped_at < 5  # read at once, leases are 60 s
    for result in (interrupted, *behind):
        job = jobs[result.id]
        assert job.state == JobState.READY, (job.state, output)
        assert (job.attempts, job.errors, job.worker_ids) == (0, [], [])
        assert (job.locked_until, job.claimed_by) == (None, None)


def test_a_job_that_kills_every_worker_shows_each_attempt_and_ends_failed():
    """Each attempt's worker dies (SIGKILL, inside the task): the next worker's rescue
    records it as a ``WorkerLost`` attempt, and after its ``max_attempts`` (2) the job
    is FAILED instead of killing workers for ever."""
    result = tasks.kills_its_worker.enqueue()
    killed = 0
    deadline = time.monotonic() + 90
    outputs = []
    while time.monotonic() < deadline:
        result.refresh()
        if result.is_finished:
            break
        worker = start_worker()
        try:
            wait_for(
                lambda w=worker: w.poll() is not None or finished(result)(),
                timeout=30,
                what="the worker to run (and die of) the job",
            )
        finally:
            outputs.append(stop_worker(worker))
        if worker.returncode == -signal.SIGKILL:
            killed += 1
    result.refresh()
    assert result.status == compat.TaskResultStatus.FAILED, outputs
    assert killed == 2
    assert result.attempts == 2
    assert [e.exception_class_path for e in result.errors] == [WORKER_LOST] * 2
    assert [e.traceback.startswith(f"attempt {n}:") for n, e in enumerate(result.errors, 1)] == [
        True,
        True,
    ]
    assert result.finished_at is not None
    # Django's TaskError resolves the recorded path to an exception class.
    assert issubclass(result.errors[0].exception_class, BaseException)
