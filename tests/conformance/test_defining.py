"""Defining tasks for our backend: the decorator, ``using()``, validation.

These re-express, for our database backend, the contract that Django's own
tests state (read from Django 6.1.3's ``tests/tasks/``: ``test_tasks.py``,
``test_custom_backend.py``, ``test_dummy_backend.py``); the same checks run on
Django 6.1's ``django.tasks`` and on Django 5.2 with the ``django-tasks``
backport. Where the two Tasks APIs word an error differently, the check
matches what both say.
"""

import pickle
from datetime import datetime, timedelta

import pytest
from django.utils import timezone
from django.utils.module_loading import import_string

from django_outbox.jobs import compat
from django_outbox.jobs.backend import JobsBackend, JobTask
from tests.conformance import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.jobs]


# -- the backend ------------------------------------------------------------------


def test_each_alias_is_our_backend_with_its_alias_and_options(settings):
    settings.TASKS = {
        **settings.TASKS,
        "third": {"BACKEND": "django_outbox.jobs.JobsBackend", "OPTIONS": {"DATABASE": "default"}},
    }
    default = compat.task_backends["default"]
    assert isinstance(default, JobsBackend)
    assert default.alias == "default"
    assert default.options == {}
    third = compat.task_backends["third"]
    assert (third.alias, third.options) == ("third", {"DATABASE": "default"})


def test_the_backend_says_what_it_supports():
    backend = compat.task_backends["default"]
    assert backend.supports_defer is True
    assert backend.supports_async_task is True
    assert backend.supports_get_result is True
    assert backend.supports_priority is True


def test_a_valid_configuration_has_no_check_messages():
    assert list(compat.task_backends["default"].check()) == []


# -- the decorator ----------------------------------------------------------------


def test_the_decorator_builds_our_task_class_with_or_without_parentheses():
    for task in (tasks.nothing, tasks.nothing_bare, tasks.nothing_async):
        assert isinstance(task, JobTask)
        assert isinstance(task, compat.Task)
    assert tasks.nothing.get_backend() is compat.task_backends["default"]


def test_our_options_default_to_unset():
    task = compat.task()(tasks.nothing.func)
    assert (task.max_attempts, task.timeout, task.unique_key, task.serial_key) == (
        None,
        None,
        None,
        None,
    )
    assert (task.retry_on, task.dont_retry) == ((Exception,), ())


def test_the_decorator_passes_our_options_and_django_s_together():
    task = compat.task(priority=10, queue_name="other", max_attempts=5, timeout=3)(
        tasks.nothing.func
    )
    assert isinstance(task, JobTask)
    assert (task.priority, task.queue_name, task.max_attempts, task.timeout) == (10, "other", 5, 3)
    assert task.takes_context is False
    assert task.run_after is None


def test_an_unknown_decorator_option_is_a_type_error():
    with pytest.raises(TypeError):
        compat.task(no_such_option=123)(tasks.nothing.func)


def test_run_after_cannot_be_given_to_the_decorator():
    with pytest.raises(TypeError, match="run_after"):
        compat.task(run_after=timezone.now())(tasks.answer.func)


def test_a_task_has_django_s_name_and_module_path():
    assert tasks.nothing.name == "nothing"
    assert tasks.nothing_async.name == "nothing_async"
    assert tasks.nothing.module_path == "tests.conformance.tasks.nothing"
    assert import_string(tasks.nothing.module_path) is tasks.nothing
    assert import_string(tasks.nothing_async.module_path) is tasks.nothing_async


def test_calling_a_task_directly_runs_its_function():
    from asgiref.sync import async_to_sync

    assert tasks.answer.call() == 42
    assert tasks.nothing_async.call() is None
    assert async_to_sync(tasks.answer.acall)() == 42
    assert async_to_sync(tasks.nothing_async.acall)() is None


# -- using() ----------------------------------------------------------------------


def test_using_makes_a_new_task_and_leaves_the_original_alone():
    at = timezone.now() + timedelta(minutes=5)
    assert tasks.nothing.using(priority=1).priority == 1
    assert tasks.nothing.using(queue_name="other").queue_name == "other"
    assert tasks.nothing.using(run_after=at).run_after == at
    assert tasks.nothing.using(backend="other").backend == "other"
    assert (tasks.nothing.priority, tasks.nothing.queue_name) == (0, "default")
    assert (tasks.nothing.run_after, tasks.nothing.backend) == (None, "default")
    copy = tasks.nothing.using()
    assert copy == tasks.nothing
    assert copy is not tasks.nothing


def test_chained_using_keeps_the_earlier_changes():
    at = timezone.now() + timedelta(minutes=5)
    later = tasks.nothing.using(run_after=at)
    urgent = later.using(priority=10)
    assert (urgent.priority, urgent.run_after) == (10, at)
    assert later.priority == 0


def test_our_using_keeps_django_s_changes_and_adds_keys():
    at = timezone.now() + timedelta(minutes=5)
    task = tasks.nothing.using(priority=3, run_after=at, unique_key="k", serial_key="s")
    assert (task.priority, task.run_after, task.unique_key, task.serial_key) == (3, at, "k", "s")
    assert isinstance(task, JobTask)


def test_a_task_on_another_alias_reaches_that_backend():
    other = tasks.nothing.using(backend="other")
    assert other.get_backend() is compat.task_backends["other"]
    assert other.get_backend().alias == "other"


# -- validation -------------------------------------------------------------------


def test_a_naive_run_after_is_invalid(settings):
    settings.USE_TZ = True
    with pytest.raises(compat.InvalidTask, match="run_after must be an aware datetime"):
        tasks.nothing.using(run_after=datetime.now())  # naive on purpose


def test_priority_must_be_a_whole_number_between_the_bounds():
    message = (
        f"priority must be a whole number between {compat.TASK_MIN_PRIORITY} and "
        f"{compat.TASK_MAX_PRIORITY}"
    )
    for bad in (compat.TASK_MIN_PRIORITY - 1, compat.TASK_MAX_PRIORITY + 1, 3.1):
        with pytest.raises(compat.InvalidTask, match=message):
            tasks.nothing.using(priority=bad)
    for good in (compat.TASK_MIN_PRIORITY, 0, compat.TASK_MAX_PRIORITY):
        assert tasks.nothing.using(priority=good).priority == good


def test_a_queue_the_backend_does_not_have_is_invalid_unless_it_lists_none(settings):
    with pytest.raises(compat.InvalidTask, match="Queue 'nowhere' is not valid for backend"):
        tasks.nothing.using(queue_name="nowhere")
    settings.TASKS = {
        **settings.TASKS,
        "any-queue": {"BACKEND": "django_outbox.jobs.JobsBackend", "QUEUES": []},
    }
    task = tasks.nothing.using(queue_name="nowhere", backend="any-queue")
    assert task.queue_name == "nowhere"


def test_enqueue_validates_the_task_against_the_backend_of_the_moment(settings):
    task = tasks.nothing.using(queue_name="other")
    settings.TASKS = {"default": {"BACKEND": "django_outbox.jobs.JobsBackend"}}
    with pytest.raises(compat.InvalidTask, match="Queue 'other' is not valid for backend"):
        task.enqueue()
    from asgiref.sync import async_to_sync

    with pytest.raises(compat.InvalidTask, match="Queue 'other' is not valid for backend"):
        async_to_sync(task.aenqueue)()


def test_a_function_not_at_module_level_is_invalid():
    def local():
        return None

    for function in (any, local):
        with pytest.raises(compat.InvalidTask, match="Task function must be defined at a module"):
            compat.task()(function)


def test_takes_context_needs_a_first_argument_named_context():
    with pytest.raises(
        compat.InvalidTask,
        match="Task takes context but does not have a first argument of 'context'",
    ):
        compat.task(takes_context=True)(tasks.answer.func)


def test_our_options_are_validated_as_django_s_are():
    for bad in (
        {"max_attempts": 0},
        {"max_attempts": True},
        {"retry_on": (int,)},
        {"timeout": -1},
        {"timeout": float("inf")},
        {"unique_key": ""},
    ):
        with pytest.raises(compat.InvalidTask):
            compat.task(**bad)(tasks.nothing.func)


# -- pickling ---------------------------------------------------------------------


@pytest.mark.skipif(
    not hasattr(compat.Task, "_reconstruct"),
    reason="the django-tasks backport's Task cannot be pickled (Django 6's can)",
)
def test_a_task_and_its_result_survive_pickling():
    task = tasks.nothing.using(priority=5, queue_name="other")
    assert pickle.loads(pickle.dumps(task)) == task
    result = task.enqueue(1, two=2)
    assert pickle.loads(pickle.dumps(result)) == result
    fetched = compat.task_backends["default"].get_result(result.id)
    assert pickle.loads(pickle.dumps(fetched)) == fetched
