"""Django's task signals (``task_enqueued``, ``task_started``, ``task_finished``) and the
log lines Django's own receivers write from them.

These re-express, for our database backend, the contract of Django's signal
reference ("Tasks signals": sent by the backend class, with the enqueued,
started or finished ``TaskResult``) and the log checks of Django 6.1.3's
``tests/tasks/test_immediate_backend.py`` and ``test_dummy_backend.py``; they
run on Django 6.1 and on Django 5.2 with the ``django-tasks`` backport.

Our decisions where a durable, retrying backend has to choose (docs/jobs.md,
"Signals"): ``task_enqueued`` is sent when the job is stored in the caller's
transaction; ``task_started`` for every attempt; ``task_finished`` once, when
the job's final outcome is stored (a failed attempt that will be retried has
not finished: our ``job_failed`` signal reports it, with ``will_retry=True``).
"""

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from asgiref.sync import async_to_sync

from django_outbox import signals as our_signals
from django_outbox.jobs import compat
from django_outbox.jobs.backend import JobsBackend
from django_outbox.jobs.models import Job
from tests.conformance import tasks
from tests.conformance.conftest import TASKS_LOGGER, run_until_finished, run_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.jobs]


@contextmanager
def received(*names: str, sender=None) -> Iterator[list[tuple[str, object, object]]]:
    """Record ``(signal name, sender, task_result)`` of the Tasks API's *names*."""
    seen: list[tuple[str, object, object]] = []
    receivers = []
    for name in names:

        def receiver(sender, task_result, _name=name, **kwargs):
            seen.append((_name, sender, task_result))

        getattr(compat.signals, name).connect(receiver, sender=sender, weak=False)
        receivers.append((name, receiver))
    try:
        yield seen
    finally:
        for name, receiver in receivers:
            getattr(compat.signals, name).disconnect(receiver, sender=sender)


# -- task_enqueued ----------------------------------------------------------------


def test_task_enqueued_is_sent_by_the_backend_class_with_the_ready_result():
    with received("task_enqueued", sender=JobsBackend) as seen:
        result = tasks.nothing.enqueue(1, two=2)
        async_result = async_to_sync(tasks.nothing.aenqueue)()
    assert [(name, sender) for name, sender, _ in seen] == [("task_enqueued", JobsBackend)] * 2
    sent = seen[0][2]
    assert sent.id == result.id
    assert sent.status == compat.TaskResultStatus.READY
    assert (sent.args, sent.kwargs, sent.task) == ([1], {"two": 2}, tasks.nothing)
    assert sent.enqueued_at is not None
    assert seen[1][2].id == async_result.id


def test_task_enqueued_is_not_sent_when_a_unique_key_returns_the_existing_job():
    unique = tasks.nothing.using(unique_key="only-one")
    with received("task_enqueued") as seen:
        first = unique.enqueue()
        again = unique.enqueue()
    assert again.id == first.id
    assert len(seen) == 1


# -- task_started -----------------------------------------------------------------


def test_task_started_is_sent_by_the_backend_class_with_the_running_result():
    result = tasks.answer.enqueue()
    with received("task_started", sender=JobsBackend) as seen:
        run_worker()
    [(_, sender, started)] = seen
    assert sender is JobsBackend
    assert started.id == result.id
    assert started.status == compat.TaskResultStatus.RUNNING
    assert started.started_at is not None
    assert started.last_attempted_at is not None
    assert started.attempts == 1
    assert started.finished_at is None


def test_task_started_is_sent_for_every_attempt():
    result = tasks.fails_first_attempt.enqueue()
    with received("task_started") as seen:
        run_until_finished(result)
    assert [started.attempts for _, _, started in seen] == [1, 2]


# -- task_finished ----------------------------------------------------------------


def test_task_finished_is_sent_after_the_success_is_stored():
    result = tasks.answer.enqueue()
    stored_then = []

    def receiver(sender, task_result, **kwargs):
        stored_then.append(tasks.answer.get_result(task_result.id))

    compat.signals.task_finished.connect(receiver, sender=JobsBackend, weak=False)
    try:
        with received("task_finished") as seen:
            run_worker()
    finally:
        compat.signals.task_finished.disconnect(receiver, sender=JobsBackend)
    [(_, sender, finished)] = seen
    assert sender is JobsBackend
    assert finished.id == result.id
    assert finished.status == compat.TaskResultStatus.SUCCESSFUL
    assert finished.return_value == 42
    assert finished.finished_at is not None
    assert finished.attempts == 1
    [stored] = stored_then
    assert stored == finished  # what the receiver is told is what is stored


def test_task_finished_is_sent_once_when_a_failure_is_final_with_its_errors():
    result = tasks.raises_value_error_retried.enqueue()
    failures = []

    def on_failed(sender, job, error, will_retry, **kwargs):
        failures.append(will_retry)

    our_signals.job_failed.connect(on_failed, weak=False)
    try:
        with received("task_finished") as seen:
            run_worker()
            assert seen == []  # attempt 1 failed and will be retried: not finished
            run_until_finished(result)
    finally:
        our_signals.job_failed.disconnect(on_failed)
    [(_, sender, finished)] = seen
    assert sender is JobsBackend
    assert finished.status == compat.TaskResultStatus.FAILED
    assert finished.finished_at is not None
    assert [e.exception_class for e in finished.errors] == [ValueError] * 3
    assert finished == tasks.raises_value_error_retried.get_result(result.id)
    assert failures == [True, True, False]


@pytest.mark.parametrize(
    "task", [tasks.raises_system_exit, tasks.returns_a_function], ids=["exit", "not-json"]
)
def test_task_finished_is_sent_for_a_failure_the_worker_records_itself(task):
    result = task.enqueue()
    with received("task_finished") as seen:
        run_worker()
    [(_, _, finished)] = seen
    assert finished.id == result.id
    assert finished.status == compat.TaskResultStatus.FAILED
    assert len(finished.errors) == 1


def test_task_finished_is_sent_when_a_rescue_ends_a_job_whose_worker_died():
    """The last attempt's worker died (its lease ran out mid-attempt): the sweep records
    the attempt as ``WorkerLost``, the job is FAILED, and that is its finish."""
    from datetime import timedelta

    from django.utils import timezone

    from django_outbox.jobs.maintenance import sweep

    result = tasks.nothing.enqueue()
    Job.objects.filter(result_id=result.id).update(
        state="RUNNING",
        attempts=3,
        attempt_open=True,
        lock_token=uuid.uuid4(),
        locked_until=timezone.now() - timedelta(seconds=1),
    )
    with received("task_finished", sender=JobsBackend) as seen:
        sweep()
    [(_, _, finished)] = seen
    assert finished.id == result.id
    assert finished.status == compat.TaskResultStatus.FAILED
    assert finished.finished_at is not None
    assert [e.exception_class_path for e in finished.errors] == ["django_outbox.jobs.WorkerLost"]
    assert finished == tasks.nothing.get_result(result.id)


def test_the_signals_of_one_job_come_in_order():
    with received("task_enqueued", "task_started", "task_finished") as seen:
        result = tasks.answer.enqueue()
        run_worker()
    assert [(name, sent.id) for name, _, sent in seen] == [
        ("task_enqueued", result.id),
        ("task_started", result.id),
        ("task_finished", result.id),
    ]


def test_a_receiver_that_raises_does_not_change_what_is_recorded():
    """Ours: the worker logs a raising ``task_started``/``task_finished`` receiver and
    goes on (the job already ran, or is about to)."""

    def broken(sender, **kwargs):
        raise RuntimeError("a broken receiver")

    result = tasks.answer.enqueue()
    compat.signals.task_started.connect(broken, weak=False)
    compat.signals.task_finished.connect(broken, weak=False)
    try:
        run_worker()
    finally:
        compat.signals.task_started.disconnect(broken)
        compat.signals.task_finished.disconnect(broken)
    result.refresh()
    assert result.return_value == 42


# -- Django's log lines, written by its own receivers -------------------------------


def task_log(caplog):
    return [r for r in caplog.records if r.name == TASKS_LOGGER]


def test_django_logs_enqueued_running_and_successful(caplog):
    with caplog.at_level(logging.DEBUG, logger=TASKS_LOGGER):
        result = tasks.nothing.enqueue()
        run_worker()
    lines = [r.getMessage() for r in task_log(caplog)]
    assert len(lines) == 3, lines
    assert "enqueued" in lines[0] and result.id in lines[0]
    assert "state=RUNNING" in lines[1] and result.id in lines[1]
    assert "state=SUCCESSFUL" in lines[2] and result.id in lines[2]
    assert not any("None" in line for line in lines)


def test_django_logs_a_final_failure_as_an_error(caplog):
    with caplog.at_level(logging.DEBUG, logger=TASKS_LOGGER):
        result = tasks.raises_value_error.enqueue()
        run_worker()
    records = task_log(caplog)
    assert len(records) == 3, [r.getMessage() for r in records]
    assert "state=RUNNING" in records[1].getMessage()
    assert "state=FAILED" in records[2].getMessage() and result.id in records[2].getMessage()
    assert records[2].levelno == logging.ERROR


def test_keyboard_interrupt_finishes_nothing_and_logs_no_error(caplog):
    result = tasks.raises_keyboard_interrupt.enqueue()
    with (
        received("task_finished") as seen,
        caplog.at_level(logging.DEBUG, logger=TASKS_LOGGER),
        pytest.raises(KeyboardInterrupt),
    ):
        run_worker()
    assert seen == []
    assert not [r for r in task_log(caplog) if r.levelno >= logging.ERROR]
    assert Job.objects.get(result_id=result.id).state == "READY"
