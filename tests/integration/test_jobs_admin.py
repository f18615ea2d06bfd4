"""The jobs' admin and command: Django's statuses, each attempt's traceback, retry and
cancel guarded by their permissions (refused without), ``jobs_requeue``."""

import uuid
from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.urls import reverse

from django_outbox.jobs.models import Job, JobState
from django_outbox.jobs.running import Jobs
from testproject.shop import jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.jobs]

CHANGELIST = "admin:django_outbox_job_changelist"


def staff(*codenames):
    user = User.objects.create_user("op-" + "-".join(codenames or ("none",)), is_staff=True)
    perms = Permission.objects.filter(
        content_type__app_label="django_outbox", codename__in=["view_job", *codenames]
    )
    user.user_permissions.add(*perms)
    return user


def act(client, action, rows, *, confirmed=True):
    data = {"action": action, "_selected_action": [r.pk for r in rows]}
    if confirmed:
        data["confirmed"] = "yes"
    return client.post(reverse(CHANGELIST), data, follow=True)


def test_a_failed_job_shows_each_attempt_and_is_retried_by_permission(client):
    jobs.refuses.enqueue("x")
    Jobs().drain()
    job = Job.objects.get()
    client.force_login(staff())
    response = client.get(reverse(CHANGELIST), {"state": "FAILED"})
    assert [j.pk for j in response.context["cl"].result_list] == [job.pk]
    assert "Failed" in response.text  # Django's status label
    page = client.get(reverse("admin:django_outbox_job_change", args=[job.pk]))
    assert "attempt 1 · builtins.ValueError" in page.text
    assert "Traceback (most recent call last)" in page.text
    assert "testproject.shop.jobs.refuses" in page.text

    assert "retry_jobs" not in response.text
    act(client, "retry_jobs", [job])
    job.refresh_from_db()
    assert job.state == JobState.FAILED  # refused without the permission

    client.force_login(staff("retry_job"))
    response = act(client, "retry_jobs", [job])
    assert "1 job(s) retried" in response.text
    job.refresh_from_db()
    assert (job.state, job.attempts) == (JobState.READY, 0)
    assert LogEntry.objects.filter(object_id=str(job.pk)).exists()


def test_cancel_asks_first_and_needs_its_permission(client):
    result = jobs.add.enqueue(1, 2)
    job = Job.objects.get()
    client.force_login(staff("cancel_job"))
    response = act(client, "cancel_jobs", [job], confirmed=False)
    assert "Are you sure you want to cancel these?" in response.text
    job.refresh_from_db()
    assert job.state == JobState.READY
    response = act(client, "cancel_jobs", [job])
    assert "1 job(s) cancelled" in response.text
    result.refresh()
    assert result.status == "FAILED"
    assert Jobs().drain().claimed == 0


def test_skip_releases_a_serial_key_and_needs_its_permission(client):
    jobs.order_step.enqueue(order="s", step=1, fail=True)
    later = jobs.order_step.enqueue(order="s", step=2)
    Jobs().drain()
    head = Job.objects.get(serial_key="order-s", sequence=1)
    client.force_login(staff("retry_job"))
    act(client, "skip_jobs", [head])
    head.refresh_from_db()
    assert head.blocking  # refused without skip_job
    client.force_login(staff("skip_job"))
    response = act(client, "skip_jobs", [head])
    assert "1 job(s) skipped" in response.text
    Jobs().drain()
    later.refresh()
    assert later.status == "SUCCESSFUL"


def test_retry_leaves_a_job_whose_unique_key_is_taken():
    first = jobs.sync_customer.enqueue(customer="k")
    Job.objects.filter(result_id=first.id).update(state=JobState.FAILED)
    second = jobs.sync_customer.enqueue(customer="k")  # the key is free: a new job
    assert second.id != first.id
    assert Job.objects.retry() == 0  # the second holds the key
    assert Job.objects.get(result_id=first.id).state == JobState.FAILED


def test_jobs_requeue_command():
    for n in range(3):
        jobs.refuses.enqueue(n)
    jobs.always_fails.enqueue("other")
    while Jobs().drain().claimed:
        pass
    Job.objects.filter(task_path__endswith="always_fails").update(state=JobState.FAILED)
    with pytest.raises(CommandError, match="--task, --queue, --id"):
        call_command("jobs_requeue")
    out = StringIO()
    call_command("jobs_requeue", "--task", "testproject.shop.jobs.refuses", "--dry-run", stdout=out)
    assert out.getvalue().strip() == "3 job(s) would be retried (dry run)"
    out = StringIO()
    call_command("jobs_requeue", "--task", "testproject.shop.jobs.refuses", stdout=out)
    assert out.getvalue().strip() == "retried 3 job(s)"
    assert Job.objects.filter(state=JobState.READY).count() == 3


def test_jobs_requeue_by_row_id_and_result_id():
    first, second, third = (jobs.refuses.enqueue(n) for n in range(3))
    Job.objects.update(state=JobState.FAILED)
    row = Job.objects.get(result_id=first.id).pk
    out = StringIO()
    call_command("jobs_requeue", "--id", str(row), "--id", str(second.id), stdout=out)
    assert out.getvalue().strip() == "retried 2 job(s)"
    assert dict(Job.objects.values_list("result_id", "state")) == {
        uuid.UUID(first.id): JobState.READY,
        uuid.UUID(second.id): JobState.READY,
        uuid.UUID(third.id): JobState.FAILED,
    }
    with pytest.raises(CommandError, match="row id"):
        call_command("jobs_requeue", "--id", "not-an-id")
