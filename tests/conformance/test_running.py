"""Running jobs: results, errors and tracebacks, return values, the context, async
tasks, ``run_after``, priorities and queues.

These re-express, for our database backend, the contract that Django's own
tests state for a backend that runs tasks (read from Django 6.1.3's
``tests/tasks/test_immediate_backend.py`` and ``tasks.py``); they run on
Django 6.1 and on Django 5.2 with the ``django-tasks`` backport. Django's
immediate backend runs a task inside ``enqueue``; ours stores it, and a worker
(here ``Jobs().drain()`` in this process) runs it after the commit.
"""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from django_outbox.jobs import compat
from django_outbox.jobs.models import Job, JobState
from django_outbox.jobs.running import Jobs
from django_outbox.jobs.timeouts import JobTimeout
from tests.conformance import tasks
from tests.conformance.conftest import run_until_finished, run_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.jobs]


def assert_finished_in_order(result):
    """Timestamps of a finished result: all set, and in the order things happened."""
    assert result.is_finished is True
    assert None not in (result.started_at, result.last_attempted_at, result.finished_at)
    assert result.started_at >= result.enqueued_at
    assert result.last_attempted_at >= result.started_at
    assert result.finished_at >= result.started_at


def failed_once(task, *args):
    """Enqueue *task*, run it, and return its refreshed result (FAILED, one attempt)."""
    result = task.enqueue(*args)
    run_worker()
    result.refresh()
    assert result.status == compat.TaskResultStatus.FAILED, result.errors
    assert result.attempts == 1
    assert len(result.errors) == 1
    return result


# -- success ----------------------------------------------------------------------


def test_a_sync_or_async_task_runs_to_success():
    for task in (tasks.nothing, tasks.nothing_async):
        result = task.enqueue(1, two=3)
        run_worker()
        result.refresh()
        assert result.status == compat.TaskResultStatus.SUCCESSFUL
        assert_finished_in_order(result)
        assert result.return_value is None
        assert result.task == task
        assert (result.args, result.kwargs) == ([1], {"two": 3})
        assert result.attempts == 1
        assert result.errors == []


def test_the_return_value_is_the_result():
    result = tasks.answer.enqueue()
    run_worker()
    assert tasks.answer.get_result(result.id).return_value == 42


def test_json_return_values_come_back_as_they_were_returned():
    values = [None, True, 0, -1.5, "text", [1, "two", None], {"a": {"b": [1, 2]}}, []]
    results = [tasks.give.enqueue(value) for value in values]
    run_worker()
    for value, result in zip(values, results, strict=True):
        result.refresh()
        assert result.return_value == value


def test_a_returned_tuple_comes_back_as_a_list_as_django_normalises_it():
    result = tasks.give.enqueue(["as-tuple", 1])
    run_worker()
    result.refresh()
    assert result.return_value == ["as-tuple", 1]


# -- failures ---------------------------------------------------------------------


def test_an_exception_fails_the_task_with_its_class_and_traceback():
    result = failed_once(tasks.raises_value_error)
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018 - Django raises for a failed task
    assert_finished_in_order(result)
    error = result.errors[0]
    assert error.exception_class is ValueError
    assert error.traceback.endswith("ValueError: the task raised ValueError\n"), error.traceback
    assert result.task == tasks.raises_value_error
    assert (result.args, result.kwargs) == ([], {})


def test_an_exception_inside_an_exception_is_recorded_whole():
    result = failed_once(tasks.raises_nested_exception)
    assert result._return_value is None
    assert result.errors[0].exception_class is ValueError
    traceback = result.errors[0].traceback
    assert 'ValueError(ValueError("an exception inside an exception"))' in traceback


def test_system_exit_fails_the_task_and_the_worker_goes_on():
    """Django's immediate backend records ``SystemExit`` as the task's failure. It is
    not retried: a task that exits asked for its process to end, not for another try."""
    result = tasks.raises_system_exit.enqueue()
    after = tasks.answer.enqueue()
    run_worker()
    result.refresh()
    assert result.status == compat.TaskResultStatus.FAILED
    assert result.attempts == 1
    assert_finished_in_order(result)
    assert result.errors[0].exception_class is SystemExit
    assert result.errors[0].traceback.endswith("SystemExit: the task raised SystemExit\n")
    after.refresh()
    assert after.return_value == 42


def test_sys_exit_in_a_task_is_a_failure_too():
    result = failed_once(tasks.calls_exit)
    assert result.errors[0].exception_class is SystemExit
    assert result.errors[0].traceback.endswith("SystemExit: 1\n")


def test_keyboard_interrupt_stops_the_worker_and_gives_the_job_back_at_once():
    """Django lets ``KeyboardInterrupt`` through (the user asked to stop). Ours goes up
    too, and the job is READY again at once, its attempt not counted, nothing logged."""
    result = tasks.raises_keyboard_interrupt.enqueue()
    with pytest.raises(KeyboardInterrupt):
        run_worker()
    job = Job.objects.get(result_id=result.id)
    assert job.state == JobState.READY
    assert (job.attempts, job.errors, job.worker_ids) == (0, [], [])
    assert job.locked_until is None
    result.refresh()
    assert result.status == compat.TaskResultStatus.READY
    assert result.attempts == 0


def test_a_return_value_that_is_not_json_is_a_type_error_and_not_retried():
    """Django records a ``TypeError`` ("Unsupported type"). The job's work is done, so
    running it again would repeat its effects: one attempt, then FAILED."""
    result = failed_once(tasks.returns_a_function)
    assert_finished_in_order(result)
    assert result._return_value is None
    error = result.errors[0]
    assert issubclass(error.exception_class, TypeError)
    assert "Unsupported type" in error.traceback
    assert "function" in error.traceback
    assert "not retried" in error.traceback  # why
    assert "plain JSON" in error.traceback  # what to do


def test_returned_bytes_and_int_keys_fail_as_they_would_as_arguments():
    for task, why in ((tasks.returns_bytes, "is bytes"), (tasks.returns_int_keys, "has the key 1")):
        result = failed_once(task)
        assert issubclass(result.errors[0].exception_class, TypeError)
        assert why in result.errors[0].traceback


def test_a_plain_failing_task_is_retried_by_our_backend_each_attempt_recorded():
    """Where we differ by design: without ``max_attempts`` a task gets three attempts
    (Django's immediate backend has one). Each shows in ``errors``."""
    result = tasks.raises_value_error_retried.enqueue()
    run_worker()
    result.refresh()
    assert result.status == compat.TaskResultStatus.READY
    assert result.attempts == 1
    assert [e.exception_class for e in result.errors] == [ValueError]
    result = run_until_finished(result)
    assert result.status == compat.TaskResultStatus.FAILED
    assert result.attempts == 3
    assert [e.exception_class for e in result.errors] == [ValueError] * 3


# -- the context ------------------------------------------------------------------


def test_a_task_taking_context_sees_its_own_result():
    result = tasks.own_id.enqueue()
    run_worker()
    result.refresh()
    assert result.return_value == result.id


def test_the_context_is_django_s_and_counts_the_attempt():
    result = tasks.check_context.enqueue(1)
    run_worker()
    result.refresh()
    assert result.status == compat.TaskResultStatus.SUCCESSFUL, result.errors
    retried = tasks.fails_first_attempt.enqueue()
    retried = run_until_finished(retried)
    assert retried.return_value == 2
    assert retried.attempts == 2


def test_the_context_s_task_is_the_one_enqueued_with_using():
    at = timezone.now() - timedelta(seconds=1)
    result = tasks.sees_its_task.using(priority=9, queue_name="other", run_after=at).enqueue()
    run_worker()
    result.refresh()
    seen = result.return_value
    assert (seen["priority"], seen["queue_name"], seen["run_after"]) == (
        9,
        "other",
        at.isoformat(),
    )
    assert (seen["status"], seen["attempts"], seen["id"]) == ("RUNNING", 1, result.id)
    assert (seen["backend"], seen["result_backend"]) == ("default", "default")


def test_a_job_of_another_alias_runs_with_that_alias():
    result = tasks.sees_its_task.using(backend="other").enqueue()
    refreshing = tasks.refreshes_itself.using(backend="other").enqueue()
    run_worker()
    result.refresh()
    assert (result.return_value["backend"], result.return_value["result_backend"]) == (
        "other",
        "other",
    )
    refreshing.refresh()
    assert refreshing.return_value == "RUNNING"


# -- async tasks ------------------------------------------------------------------


def test_an_async_task_runs_and_returns_its_value():
    result = tasks.async_answer.enqueue()
    run_worker()
    result.refresh()
    assert result.return_value == 42


@pytest.mark.parametrize("task", [tasks.async_sleeps_then_writes, tasks.async_busy_then_writes])
def test_an_async_task_over_its_timeout_stops_where_it_awaits(task, tmp_path):
    """The timeout is enforced inside the event loop: the coroutine is cancelled at an
    ``await`` and the code after it never runs (an alarm would only interrupt the
    thread waiting for the loop, and the coroutine would go on)."""
    marker = tmp_path / "after-the-await"
    started = time.monotonic()
    result = task.enqueue(4.0, str(marker))
    run_worker()
    took = time.monotonic() - started
    time.sleep(4.2)  # had the coroutine gone on, it would have written by now
    assert not marker.exists()
    result.refresh()
    assert result.status == compat.TaskResultStatus.FAILED
    assert took < 3, f"the worker waited {took:.1f}s (the timeout is 0.3 s, the sleep 4 s)"
    error = result.errors[0]
    assert error.exception_class is JobTimeout
    assert "longer than its timeout of 0.3 s" in error.traceback


# -- when and in which order ------------------------------------------------------


def test_run_after_holds_a_job_back_until_then():
    soon = timezone.now() + timedelta(seconds=3)  # a loaded machine may stall a second
    held = tasks.answer.using(run_after=soon).enqueue()
    far = tasks.answer.using(run_after=timezone.now() + timedelta(days=1)).enqueue()
    run_worker()
    held.refresh()
    assert held.status == compat.TaskResultStatus.READY
    time.sleep(max(0.0, (soon - timezone.now()).total_seconds()) + 0.2)
    run_worker()
    held.refresh()
    assert held.status == compat.TaskResultStatus.SUCCESSFUL
    assert held.started_at >= soon
    assert held.task.run_after == soon
    far.refresh()
    assert far.status == compat.TaskResultStatus.READY
    assert Job.objects.get(result_id=far.id).run_after == far.task.run_after


def test_a_higher_priority_runs_first():
    low = tasks.nothing.using(priority=-10).enqueue()
    middle = tasks.nothing.enqueue()
    high = tasks.nothing.using(priority=10).enqueue()
    ran = []
    for _ in range(3):
        Jobs(batch_size=1).run_batch()
        ran += [
            r.task.priority
            for r in (low, middle, high)
            if r.task.priority not in ran and tasks.nothing.get_result(r.id).is_finished
        ]
    assert ran == [10, 0, -10]


def test_a_worker_of_one_queue_leaves_the_others_alone():
    default = tasks.nothing.enqueue()
    other = tasks.nothing.using(queue_name="other").enqueue()
    run_worker(queues=["other"])
    default.refresh()
    other.refresh()
    assert (default.status, other.status) == ("READY", "SUCCESSFUL")
    assert other.task.queue_name == "other"
