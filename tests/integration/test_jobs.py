"""Background jobs through Django's Tasks API on our backend, run in-process."""

import time
import uuid
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from django_outbox.engine import triggers
from django_outbox.jobs import JobArgumentsError, cancel_requested, compat
from django_outbox.jobs.models import Job, JobState
from django_outbox.jobs.running import Jobs
from testproject.shop import jobs
from testproject.shop.models import Payment

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.jobs]


def run_all(**options):
    return Jobs(**options).drain()


def wait_and_run(result, *, until, timeout=10.0):
    """Drain (retries are backed off) until *result* reaches one of *until*."""
    deadline = time.monotonic() + timeout
    while True:
        run_all()
        result.refresh()
        if result.status in until or time.monotonic() > deadline:
            return result
        time.sleep(0.05)


def test_enqueue_joins_the_transaction_a_rollback_leaves_no_job():
    with pytest.raises(RuntimeError), transaction.atomic():
        jobs.record_payment.enqueue("rolled-back")
        assert Job.objects.count() == 1  # inside, the job is there
        raise RuntimeError("the business transaction fails")
    assert not Job.objects.exists()
    assert run_all().claimed == 0
    assert not Payment.objects.exists()


def test_a_committed_job_runs_and_its_result_is_recorded():
    with transaction.atomic():
        result = jobs.add.enqueue(2, 3)
    assert result.status == compat.TaskResultStatus.READY
    assert result.enqueued_at is not None
    assert result.backend == "default"
    outcome = run_all()
    assert (outcome.claimed, outcome.done) == (1, 1)
    fetched = jobs.add.get_result(result.id)
    assert fetched.status == compat.TaskResultStatus.SUCCESSFUL
    assert fetched.return_value == 5
    assert fetched.args == [2, 3]
    assert fetched.attempts == 1
    assert len(fetched.worker_ids) == 1
    assert fetched.enqueued_at <= fetched.started_at <= fetched.finished_at
    assert fetched.last_attempted_at == fetched.started_at
    assert fetched.errors == []
    result.refresh()
    assert result.return_value == 5


def test_get_result_of_an_unknown_id_raises_django_s_error():
    backend = compat.task_backends["default"]
    with pytest.raises(compat.TaskResultDoesNotExist):
        backend.get_result(str(uuid.uuid4()))
    with pytest.raises(compat.TaskResultDoesNotExist):
        backend.get_result("not-a-uuid")


def test_retries_back_off_and_count_attempts_until_success():
    result = jobs.flaky.enqueue("flaky-1", 2)
    first = run_all()
    assert (first.claimed, first.retried) == (1, 1)
    job = Job.objects.get()
    assert job.state == JobState.READY
    assert job.available_at > timezone.now()  # backed off: not due again at once
    assert run_all().claimed == 0
    result = wait_and_run(result, until={"SUCCESSFUL", "FAILED"})
    assert result.status == "SUCCESSFUL"
    assert result.attempts == 3
    assert result.return_value == 3  # TaskContext.attempt counted the retries
    assert [e.exception_class_path for e in result.errors] == ["builtins.ConnectionError"] * 2
    assert "attempt 1 of flaky-1" in result.errors[0].traceback
    assert "Traceback" in result.errors[1].traceback
    assert list(Payment.objects.values_list("status", flat=True)) == ["attempt-3"]


def test_a_job_failing_every_attempt_ends_failed_with_each_traceback():
    result = jobs.always_fails.enqueue("broken")
    result = wait_and_run(result, until={"FAILED"})
    assert result.status == "FAILED"
    assert result.attempts == 3
    assert len(result.errors) == 3
    assert all(e.exception_class_path == "builtins.RuntimeError" for e in result.errors)
    assert all("broken" in e.traceback for e in result.errors)
    assert result.finished_at is not None
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018 - Django raises for a failed task
    job = Job.objects.get()
    assert job.last_error.startswith("gave up after 3 attempts")


def test_exceptions_not_to_retry_fail_at_once():
    result = jobs.refuses.enqueue(7)
    run_all()
    result.refresh()
    assert (result.status, result.attempts) == ("FAILED", 1)
    assert result.errors[0].exception_class_path == "builtins.ValueError"


def test_arguments_that_are_not_json_fail_in_the_caller_and_store_nothing():
    with transaction.atomic():
        jobs.add.enqueue(1, 2)
        for bad, where in [
            ((timezone.now(), 1), "args[0] is a datetime.datetime"),
            ((1, {2: "x"}), "args[1] has the key 2"),
            ((float("nan"), 1), "args[0] is nan"),
            (({1, 2}, 1), "args[0] is a builtins.set"),
        ]:
            with pytest.raises(JobArgumentsError) as caught:
                jobs.add.enqueue(*bad)
            assert where in str(caught.value)
            assert "testproject.shop.jobs.add" in str(caught.value)
        # The caller's transaction is still usable.
        jobs.add.enqueue(3, 4)
    assert Job.objects.count() == 2


def test_invalid_tasks_raise_django_s_invalid_task():
    from django_outbox.jobs.backend import JobTask

    with pytest.raises(compat.InvalidTask, match="max_attempts"):
        JobTask(func=jobs.add.func, max_attempts=0)
    with pytest.raises(compat.InvalidTask, match="retry_on"):
        JobTask(func=jobs.add.func, retry_on=(int,))
    with pytest.raises(compat.InvalidTask, match="Queue"):
        jobs.add.using(queue_name="nowhere")


def test_unique_key_returns_the_active_job_instead_of_a_new_one():
    first = jobs.sync_customer.enqueue(customer="c-1")
    again = jobs.sync_customer.enqueue(customer="c-1")
    other = jobs.sync_customer.enqueue(customer="c-2")
    assert again.id == first.id
    assert other.id != first.id
    assert Job.objects.count() == 2
    run_all()
    # Finished: the key is free again.
    later = jobs.sync_customer.enqueue(customer="c-1")
    assert later.id != first.id
    assert Job.objects.filter(unique_key="sync-c-1").count() == 2


def test_unique_key_inside_a_transaction_that_already_has_one():
    with transaction.atomic():
        first = jobs.sync_customer.enqueue(customer="c-9")
        again = jobs.sync_customer.enqueue(customer="c-9")
        jobs.add.enqueue(1, 1)  # the duplicate left the transaction usable
    assert again.id == first.id
    assert Job.objects.count() == 2


def test_priority_and_run_after():
    low = jobs.add.using(priority=-5).enqueue(1, 1)
    high = jobs.add.using(priority=50).enqueue(2, 2)
    due = timezone.now() + timedelta(seconds=3)  # a loaded machine may stall a second
    later = jobs.add.using(run_after=due).enqueue(3, 3)
    assert Jobs(batch_size=1).run_batch().done == 1
    high.refresh()
    low.refresh()
    assert (high.status, low.status) == ("SUCCESSFUL", "READY")
    run_all()
    later.refresh()
    assert later.status == "READY"  # not before run_after
    time.sleep(max(0.0, (due - timezone.now()).total_seconds()) + 0.1)
    run_all()
    later.refresh()
    assert later.status == "SUCCESSFUL"
    assert later.started_at >= later.task.run_after if later.task.run_after else True


def test_a_runner_takes_only_its_queues():
    email = jobs.send_email.enqueue("a@example.com")
    plain = jobs.add.enqueue(1, 2)
    assert Jobs(queues=["default"]).drain().done == 1
    email.refresh()
    plain.refresh()
    assert (plain.status, email.status) == ("SUCCESSFUL", "READY")
    assert Jobs(queues=["emails"]).drain().done == 1


def test_cancel_a_ready_job_and_ask_a_running_one_to_stop():
    ready = jobs.record_payment.enqueue("never")
    assert Job.objects.filter(result_id=ready.id).cancel() == 1
    run_all()
    ready.refresh()
    assert ready.status == "FAILED"
    assert not Payment.objects.exists()
    job = Job.objects.get(result_id=ready.id)
    assert job.resolution == "cancelled"
    running = jobs.add.enqueue(1, 1)
    Job.objects.filter(result_id=running.id).update(state=JobState.RUNNING)
    assert not cancel_requested(running.id)
    assert Job.objects.filter(result_id=running.id).cancel() == 0
    assert cancel_requested(running.id)


def test_retry_a_failed_job():
    result = jobs.refuses.enqueue(1)
    run_all()
    assert Job.objects.retry() == 1
    job = Job.objects.get()
    assert (job.state, job.attempts, job.finished_at) == (JobState.READY, 0, None)
    run_all()
    result.refresh()
    assert result.status == "FAILED"
    assert len(result.errors) == 2  # the history of the first round is kept


def test_a_task_written_for_the_immediate_backend_runs_unchanged(settings):
    """Django's own ImmediateBackend and ours run the same task function the same way."""
    settings.TASKS = {
        "default": {"BACKEND": "django_outbox.jobs.JobsBackend", "QUEUES": ["default"]},
        "immediate": {"BACKEND": f"{compat.SOURCE}.backends.immediate.ImmediateBackend"},
    }
    immediate = compat.task(backend="immediate")(jobs.add.func)
    ours = compat.task()(jobs.add.func)
    expected = immediate.enqueue(20, 22)
    assert expected.status == "SUCCESSFUL"
    result = ours.enqueue(20, 22)
    run_all()
    result.refresh()
    assert result.return_value == expected.return_value == 42


def test_the_commit_sends_one_trigger_per_queue(configure_outbox, monkeypatch):
    configure_outbox(DISPATCH="celery", DISPATCH_IN_BACKGROUND=False)
    sent = []
    monkeypatch.setattr(
        triggers, "_send_celery", lambda part, using, ids: sent.append((part, list(ids)))
    )
    with transaction.atomic():
        a = jobs.add.enqueue(1, 1)
        b = jobs.add.enqueue(2, 2)
        c = jobs.send_email.enqueue("x@example.com")
        assert sent == []
    pks = dict(Job.objects.values_list("result_id", "pk"))
    assert sorted(sent) == sorted(
        [
            ("jobs:default", [pks[uuid.UUID(a.id)], pks[uuid.UUID(b.id)]]),
            ("jobs:emails", [pks[uuid.UUID(c.id)]]),
        ]
    )


def test_trigger_routing_maps_job_queues_to_celery_queues(configure_outbox):
    from django_outbox.jobs.running import _route

    assert _route("default") == ({"queue": "default"}, {})
    assert _route("emails") == ({"queue": "emails"}, {"queue": "emails"})
    configure_outbox(JOBS={"CELERY_QUEUES": {"emails": "mail-workers"}})
    assert _route("emails") == ({"queue": "emails"}, {"queue": "mail-workers"})


def steps_done():
    return list(Payment.objects.order_by("pk").values_list("order_ref", flat=True))


def test_serial_jobs_run_one_at_a_time_in_enqueue_order():
    for step in (1, 2, 3):
        jobs.order_step.enqueue(order="o1", step=step)
    jobs.order_step.enqueue(order="o2", step=1)
    # Only the head of a key can be claimed: a second runner gets the other key.
    first = Jobs(batch_size=1)
    rows, lease = first.claim_batch()
    assert [(r.serial_key, r.sequence) for r in rows] == [("order-o1", 1)]
    second = Jobs(batch_size=10)
    other, other_lease = second.claim_batch()
    assert [(r.serial_key, r.sequence) for r in other] == [("order-o2", 1)]
    second._run(other, other_lease)
    first._run(rows, lease)
    run_all()
    done = steps_done()
    assert [ref for ref in done if ref.startswith("o1")] == ["o1:1", "o1:2", "o1:3"]
    assert Job.objects.filter(state=JobState.SUCCESSFUL).count() == 4


def test_a_failed_serial_job_holds_back_only_its_key_until_skipped():
    jobs.order_step.enqueue(order="a", step=1, fail=True)
    jobs.order_step.enqueue(order="a", step=2)
    jobs.order_step.enqueue(order="b", step=1)
    run_all()
    head = Job.objects.get(serial_key="order-a", sequence=1)
    assert (head.state, head.blocking) == (JobState.FAILED, True)
    waiting = Job.objects.get(serial_key="order-a", sequence=2)
    assert (waiting.state, waiting.blocked) == (JobState.READY, True)
    assert Job.objects.get(serial_key="order-b").state == JobState.SUCCESSFUL
    # Enqueued while the key is held: parked at once.
    jobs.order_step.enqueue(order="a", step=3)
    assert Job.objects.get(serial_key="order-a", sequence=3).blocked
    assert run_all().claimed == 0
    assert Job.objects.filter(pk=head.pk).skip() == 1
    run_all()
    assert [ref for ref in steps_done() if ref.startswith("a")] == ["a:1", "a:2", "a:3"]
    head.refresh_from_db()
    assert (head.state, head.resolution, head.blocking) == (JobState.FAILED, "skipped", False)


def test_a_failed_serial_job_retried_by_an_operator_runs_before_the_rest():
    jobs.order_step.enqueue(order="r", step=1, fail=True)
    jobs.order_step.enqueue(order="r", step=2)
    run_all()
    assert Job.objects.filter(serial_key="order-r", sequence=1).retry() == 1
    run_all()  # fails again: the key is still held
    assert Job.objects.get(serial_key="order-r", sequence=2).state == JobState.READY
    Job.objects.filter(serial_key="order-r", sequence=1).update(
        kwargs={"order": "r", "step": 1, "fail": False}
    )  # the "fix"
    Job.objects.filter(serial_key="order-r", sequence=1).retry()
    run_all()
    assert [ref for ref in steps_done() if ref.startswith("r")] == ["r:1", "r:1", "r:1", "r:2"]
    assert Job.objects.filter(serial_key="order-r", state=JobState.SUCCESSFUL).count() == 2


def test_cancelling_a_parked_key_s_head_releases_the_rest():
    jobs.order_step.enqueue(order="c", step=1, fail=True)
    jobs.order_step.enqueue(order="c", step=2)
    run_all()
    Job.objects.filter(serial_key="order-c", sequence=1).retry()
    assert Job.objects.filter(serial_key="order-c", sequence=1).cancel() == 1
    run_all()
    assert Job.objects.get(serial_key="order-c", sequence=2).state == JobState.SUCCESSFUL


def test_a_batch_calls_its_callback_once_with_the_counts():
    from django_outbox.jobs import batch
    from django_outbox.jobs.models import JobBatch

    with batch(on_finish=jobs.batch_done, tag="t1") as opened:
        for n in range(5):
            jobs.record_payment.enqueue(f"b-{n}")
        jobs.refuses.enqueue("no")
    assert opened.count == 6
    Jobs(batch_size=2).run_batch()  # part of it: not finished, no callback
    assert not Payment.objects.filter(order_ref="batch:t1").exists()
    while run_all().claimed:
        pass
    row = JobBatch.objects.get()
    assert (row.total, row.succeeded, row.failed) == (6, 5, 1)
    assert row.finished_at is not None
    callback = jobs.batch_done.get_result(str(row.callback_result_id))
    assert callback.status == "SUCCESSFUL"
    assert callback.kwargs["batch"] == {"id": opened.id, "total": 6, "succeeded": 5, "failed": 1}
    assert list(Payment.objects.filter(order_ref="batch:t1").values_list("status", flat=True)) == [
        "5/1/6"
    ]
    from django_outbox.jobs import batches

    assert batches.complete("default", [row.pk]) == 0  # once, whoever asks again
    assert batches.sweep("default") == 0


def test_a_batch_rolled_back_leaves_nothing_and_an_empty_one_calls_back_at_once():
    from django_outbox.jobs import batch
    from django_outbox.jobs.models import JobBatch

    with pytest.raises(RuntimeError), batch(on_finish=jobs.batch_done, tag="gone"):
        jobs.record_payment.enqueue("x")
        raise RuntimeError("rolled back")
    assert not JobBatch.objects.exists()
    assert not Job.objects.exists()
    with batch(on_finish=jobs.batch_done, tag="empty"):
        pass
    run_all()
    assert Payment.objects.get(order_ref="batch:empty").status == "0/0/0"


def test_the_sweep_wakes_each_queue_with_due_jobs_once(monkeypatch):
    from django_outbox.jobs.maintenance import sweep

    later = timezone.now() + timedelta(hours=1)
    Job.objects.bulk_create(
        [
            *(Job(task_path="t.noop", queue_name="default") for _ in range(30)),
            *(Job(task_path="t.noop", queue_name="mail") for _ in range(3)),
            Job(task_path="t.noop", queue_name="parked", blocked=True),
            Job(task_path="t.noop", queue_name="later", available_at=later),
            Job(task_path="t.noop", queue_name="done", state=JobState.SUCCESSFUL),
        ]
    )
    sent = []
    monkeypatch.setattr(triggers, "dispatch", lambda channel, *rest: sent.append(channel))
    assert sweep()["woken_queues"] == ["default", "mail"]
    assert sent == ["jobs:default", "jobs:mail"]


def test_cancelled_jobs_count_as_failed_and_the_sweep_completes_a_batch():
    from django_outbox.jobs import batch, batches
    from django_outbox.jobs.models import JobBatch

    with batch(on_finish=jobs.batch_done, tag="c") as opened:
        jobs.record_payment.enqueue("c-1")
        second = jobs.record_payment.enqueue("c-2")
    Job.objects.filter(result_id=second.id).cancel()
    run_all()
    run_all()  # the callback
    assert Payment.objects.get(order_ref="batch:c").status == "1/1/2"
    # A finisher that died before completing: the sweep does it.
    with batch(on_finish=jobs.batch_done, tag="s") as opened:
        jobs.add.enqueue(1, 1)
    Job.objects.filter(batch__batch_id=opened.id).update(state=JobState.SUCCESSFUL)
    assert JobBatch.objects.get(batch_id=opened.id).finished_at is None
    assert batches.sweep("default") == 1
    run_all()
    assert Payment.objects.get(order_ref="batch:s").status == "1/0/1"


def test_a_job_over_its_timeout_is_interrupted_and_retried():
    result = jobs.too_slow.enqueue(5)
    started = time.monotonic()
    result = wait_and_run(result, until={"FAILED"})
    assert time.monotonic() - started < 4  # two attempts of 0.5 s, not two of 5 s
    assert result.attempts == 2
    assert [e.exception_class_path for e in result.errors] == [
        "django_outbox.jobs.timeouts.JobTimeout"
    ] * 2
    assert "longer than its timeout of 0.5 s" in result.errors[0].traceback
    fast = jobs.too_slow.enqueue(0.01)
    run_all()
    fast.refresh()
    assert fast.return_value == "finished"


def test_async_tasks_and_aget_result():
    import asyncio

    from asgiref.sync import async_to_sync

    result = jobs.async_add.enqueue(40, 2)
    run_all()

    async def fetch():
        return await jobs.async_add.aget_result(result.id)

    fetched = async_to_sync(fetch)()
    assert fetched.return_value == 42
    assert asyncio.iscoroutinefunction(jobs.async_add.func)


@pytest.mark.plain_retention
def test_the_purge_deletes_finished_jobs_and_batches_past_retention():
    from django_outbox.jobs import batch
    from django_outbox.jobs.maintenance import purge
    from django_outbox.jobs.models import JobBatch

    with batch():
        jobs.add.enqueue(1, 1)
    waiting = jobs.add.enqueue(2, 2)
    run_all()
    Job.objects.exclude(result_id=waiting.id).update(finished_at=timezone.now() - timedelta(days=8))
    Job.objects.filter(result_id=waiting.id).update(state=JobState.READY)
    JobBatch.objects.update(finished_at=timezone.now() - timedelta(days=8))
    assert purge() == 1
    assert list(Job.objects.values_list("result_id", flat=True)) == [uuid.UUID(waiting.id)]
    assert not JobBatch.objects.exists()


def test_result_ids_are_time_ordered_version_7_uuids():
    first = jobs.add.enqueue(1, 2)
    time.sleep(0.002)
    second = jobs.add.enqueue(3, 4)

    assert uuid.UUID(first.id).version == uuid.UUID(second.id).version == 7
    stored = list(Job.objects.order_by("result_id").values_list("result_id", flat=True))
    assert [str(value) for value in stored] == [first.id, second.id]
