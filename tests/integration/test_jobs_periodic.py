"""Periodic jobs: a beat tick enqueues its job once, even when delivered twice."""

import pytest

from django_outbox.jobs.backend import JobArgumentsError
from django_outbox.jobs.models import Job
from django_outbox.jobs.periodic import ENQUEUE_TASK, periodic
from django_outbox.tasks import enqueue_job
from testproject.shop import jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.jobs]


def test_a_periodic_entry_names_the_task_and_its_arguments():
    entry = periodic(jobs.add, 60.0, args=[1, 2], options={"expires": 30})
    assert entry == {
        "task": ENQUEUE_TASK,
        "schedule": 60.0,
        "args": ("testproject.shop.jobs.add", [1, 2], {}),
        "options": {"expires": 30},
    }
    assert periodic("testproject.shop.jobs.add", 5)["args"][0] == "testproject.shop.jobs.add"
    with pytest.raises(TypeError, match="takes a task"):
        periodic(print, 5)
    with pytest.raises(JobArgumentsError, match="args\\[0\\] is a builtins.set"):
        periodic(jobs.add, 5, args=[{1}])


def test_the_same_tick_delivered_twice_enqueues_one_job():
    """The dedup record of a tick, by its task id. That a tick whose worker process died
    is delivered again at all is proven with a real prefork worker and SIGKILL in
    tests/acceptance/test_celery_acks_late.py."""
    for _ in range(2):  # the same delivery again: same task id
        enqueue_job.apply(args=("testproject.shop.jobs.add", [1, 2], {}), task_id="tick-1")
    enqueue_job.apply(args=("testproject.shop.jobs.add", [3, 4], {}), task_id="tick-2")
    assert sorted(Job.objects.values_list("args", flat=True)) == [[1, 2], [3, 4]]
