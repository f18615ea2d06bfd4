"""Enqueueing, arguments, and reading results back: ``get_result``, ``refresh``.

These re-express, for our database backend, the contract that Django's own
tests state (read from Django 6.1.3's ``tests/tasks/``, mostly
``test_dummy_backend.py``, whose backend also stores results without running
them, and ``test_tasks.py``); they run on Django 6.1 and on Django 5.2 with the
``django-tasks`` backport. Ours differs by design in one way: ``enqueue`` joins
the caller's transaction, and the job runs after the commit.
"""

import dataclasses
import uuid
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

from django_outbox.jobs import JobArgumentsError, compat
from django_outbox.jobs.models import Job
from tests.conformance import tasks
from tests.conformance.conftest import run_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.jobs]


def assert_ready(result, task, args, kwargs):
    """What every freshly enqueued result says (Django's dummy backend's checks)."""
    assert result.status == compat.TaskResultStatus.READY
    assert result.is_finished is False
    assert result.enqueued_at is not None
    assert (result.started_at, result.last_attempted_at, result.finished_at) == (None, None, None)
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018 - Django raises until the task finished
    assert result.task == task
    assert (result.args, result.kwargs) == (args, kwargs)
    assert (result.attempts, result.errors, result.worker_ids) == (0, [], [])
    assert result.backend == task.backend


# -- enqueue ----------------------------------------------------------------------


def test_enqueue_returns_a_ready_result_for_sync_and_async_tasks():
    for task in (tasks.nothing, tasks.nothing_async):
        result = task.enqueue(1, two=3)
        assert_ready(result, task, [1], {"two": 3})
        assert Job.objects.filter(result_id=result.id).exists()


def test_aenqueue_returns_a_ready_result_for_sync_and_async_tasks():
    for task in (tasks.nothing, tasks.nothing_async):
        result = async_to_sync(task.aenqueue)()
        assert_ready(result, task, [], {})


def test_enqueue_inside_a_transaction_returns_at_once_and_runs_after_the_commit():
    with transaction.atomic():
        result = tasks.answer.enqueue()
        assert result.enqueued_at is not None
        assert result.status == compat.TaskResultStatus.READY
    run_worker()
    result.refresh()
    assert result.return_value == 42


def test_a_context_taking_task_is_enqueued_like_any_other():
    result = tasks.own_id.enqueue()
    assert result.status == compat.TaskResultStatus.READY


def test_enqueue_on_another_alias_records_that_alias():
    task = tasks.nothing.using(backend="other")
    result = task.enqueue()
    assert_ready(result, task, [], {})
    assert result.backend == "other"


def test_a_unique_key_returns_the_job_already_there_as_it_was_enqueued():
    """Ours: while a job with the key is READY or RUNNING, enqueue returns its result
    (its id, priority and ``run_after``), not a new job."""
    at = timezone.now() + timedelta(hours=1)
    first = tasks.nothing.using(unique_key="one", priority=5, run_after=at).enqueue(1)
    again = tasks.nothing.using(unique_key="one", priority=1).enqueue(2)
    assert again.id == first.id
    assert (again.task.priority, again.task.run_after, again.args) == (5, at, [1])
    assert Job.objects.count() == 1


# -- arguments --------------------------------------------------------------------


def test_an_argument_that_is_not_json_is_django_s_type_error():
    for enqueue in (tasks.nothing.enqueue, async_to_sync(tasks.nothing.aenqueue)):
        with pytest.raises(TypeError, match="Unsupported type") as caught:
            enqueue(timezone.now())
        assert isinstance(caught.value, JobArgumentsError)
        assert "args[0]" in str(caught.value)
        assert "isoformat" in str(caught.value)  # what to do instead
    assert not Job.objects.exists()


def test_json_arguments_reach_the_task_as_they_were_enqueued():
    args = ["text", 7, 2.5, True, None, [1, [2]], {"nested": {"list": [1, "a"]}}]
    kwargs = {"key": {"deep": [None, False]}, "empty": {}}
    result = tasks.echo.enqueue(*args, **kwargs)
    assert (result.args, result.kwargs) == (args, kwargs)
    run_worker()
    result.refresh()
    assert result.return_value["args"] == args
    assert result.return_value["kwargs"] == kwargs


def test_tuples_become_lists_as_django_normalises_them():
    result = tasks.echo.enqueue((1, 2), k=(3,))
    assert (result.args, result.kwargs) == ([[1, 2]], {"k": [3]})
    run_worker()
    result.refresh()
    assert result.return_value["args"] == [[1, 2]]
    assert result.return_value["types"] == ["list"]


def test_bytes_are_refused_where_django_would_decode_them():
    """Django's normalisation decodes UTF-8 bytes to str; a durable queue would hand the
    task a str for the bytes it was given, and fail only for bytes that are not UTF-8.
    We refuse bytes at enqueue, saying so (docs/jobs.md, "Arguments")."""
    with pytest.raises(JobArgumentsError, match="Unsupported type") as caught:
        tasks.nothing.enqueue(b"raw")
    message = str(caught.value)
    assert "args[0] is bytes" in message
    assert "decode" in message  # what to do instead
    assert not Job.objects.exists()


def test_non_string_keys_are_refused_where_django_would_keep_them():
    """Django keeps ``{1: "one"}`` as it is; stored as JSON it would come back as
    ``{"1": "one"}`` (and ``{1: …, "1": …}`` would lose a value). Refused, saying why."""
    with pytest.raises(JobArgumentsError) as caught:
        tasks.nothing.enqueue(mapping={1: "one"})
    message = str(caught.value)
    assert "kwargs['mapping'] has the key 1" in message
    assert "'1'" in message  # what it would turn into
    assert not Job.objects.exists()


def test_a_refused_enqueue_leaves_the_caller_s_transaction_usable():
    with transaction.atomic():
        with pytest.raises(TypeError):
            tasks.nothing.enqueue({1, 2})
        kept = tasks.nothing.enqueue(1)
    assert list(Job.objects.values_list("result_id", flat=True)) == [uuid.UUID(kept.id)]


# -- get_result -------------------------------------------------------------------


def test_get_result_equals_the_enqueued_result():
    result = compat.task_backends["default"].enqueue(tasks.nothing, (), {})
    assert tasks.nothing.get_result(result.id) == result
    assert compat.task_backends["default"].get_result(result.id) == result
    assert async_to_sync(tasks.nothing.aget_result)(result.id) == result


def test_get_result_rebuilds_the_task_as_it_was_enqueued():
    """Priority, queue and ``run_after`` of ``using()`` come back with the result."""
    at = (timezone.now() + timedelta(hours=1)).replace(microsecond=0)
    task = tasks.nothing.using(priority=7, queue_name="other", run_after=at)
    result = task.enqueue()
    fetched = compat.task_backends["default"].get_result(result.id)
    assert fetched.task == task
    assert fetched.task.run_after == at
    assert fetched == result


def test_a_result_fetched_on_another_alias_refreshes_through_that_alias(monkeypatch):
    task = tasks.nothing.using(backend="other")
    result = task.enqueue()
    other = compat.task_backends["other"]
    fetched = other.get_result(result.id)
    assert fetched.backend == "other"
    assert fetched.task.backend == "other"
    assert fetched == result
    asked = []
    original = type(other).get_result

    def get_result(self, result_id):
        asked.append(self.alias)
        return original(self, result_id)

    monkeypatch.setattr(type(other), "get_result", get_result)
    fetched.refresh()
    result.refresh()
    assert asked == ["other", "other"]


def test_a_missing_result_is_django_s_does_not_exist():
    for missing in ("123", str(uuid.uuid4())):
        with pytest.raises(compat.TaskResultDoesNotExist):
            tasks.nothing.get_result(missing)
        with pytest.raises(compat.TaskResultDoesNotExist):
            async_to_sync(tasks.nothing.aget_result)(missing)


def test_the_result_of_another_task_is_a_mismatch():
    from django_outbox.jobs.compat import TaskResultMismatch

    result = tasks.nothing_async.enqueue()
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        tasks.nothing.get_result(result.id)
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        async_to_sync(tasks.nothing.aget_result)(result.id)


# -- refresh ----------------------------------------------------------------------


def test_refreshing_a_result_that_did_not_change_changes_nothing():
    result = tasks.nothing.enqueue()
    before = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == before
    async_to_sync(result.arefresh)()
    assert dataclasses.asdict(result) == before


def test_refresh_shows_what_the_worker_recorded():
    result = tasks.answer.enqueue()
    again = tasks.answer.get_result(result.id)
    run_worker()
    assert result.status == compat.TaskResultStatus.READY  # a result is a snapshot
    result.refresh()
    assert result.status == compat.TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42
    async_to_sync(again.arefresh)()
    assert again.status == compat.TaskResultStatus.SUCCESSFUL
    assert again.return_value == 42
