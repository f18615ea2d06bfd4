"""enqueue(): arguments that would not come back from JSON are refused before the
INSERT (the caller's transaction stays usable); a stored job that cannot run is
failed by the worker with the reason."""

import re

import pytest
from django.db import transaction
from django.utils.module_loading import import_string

from django_outbox.jobs.backend import JobArgumentsError
from django_outbox.jobs.models import Job, JobState
from django_outbox.jobs.running import Jobs
from tests.badinput import tasks
from tests.badinput.cases import ENQUEUE, FAILED, RAISES
from tests.badinput.support import grown, params, table_counts

pytestmark = [pytest.mark.django_db, pytest.mark.jobs]

JOBS = Job._meta.db_table


@pytest.mark.parametrize("case", params(ENQUEUE))
def test_enqueue(case):
    given = case.given
    task = import_string(given.get("task", "tests.badinput.tasks.returns"))
    before = table_counts()
    expect = case.expect
    if expect.kind == RAISES:
        with transaction.atomic():
            with pytest.raises(JobArgumentsError, match=re.escape(expect.says)):
                task.enqueue(*given.get("args", ()), **given.get("kwargs", {}))
            tasks.returns.enqueue("after the refusal")
        assert grown(before, table_counts()) == {JOBS: 1}
        assert Job.objects.get().args == ["after the refusal"]
        return
    assert expect.kind == FAILED
    task.enqueue(*given.get("args", ()), **given.get("kwargs", {}))
    if "task_path" in given:
        Job.objects.update(task_path=given["task_path"])
    for _ in range(5):  # past every retry's backoff
        Jobs().drain()
        Job.objects.filter(state=JobState.READY).update(available_at=Job.objects.get().created_at)
    job = Job.objects.get()
    assert (job.state, job.claimed_by) == (JobState.FAILED, None)
    assert expect.says in job.last_error, job.last_error
    if "at once" in expect.stored:
        assert job.attempts == 1
    assert grown(before, table_counts()) == {JOBS: 1}
