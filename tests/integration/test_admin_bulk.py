"""Operator actions on large selections (``admin.bulk``): past ``BULK_ROWS`` rows they
move in bounded steps with a progress page between them and one history entry naming
the list's filter and the count; a closed page loses nothing. And the jobs' skip leaves
cancelled jobs alone."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse
from django.utils import timezone

from django_outbox.admin import bulk
from django_outbox.engine import operator
from django_outbox.jobs.models import Job, JobState
from django_outbox.models import InboxMessage, InboxState, OutboxMessage, OutboxState

pytestmark = pytest.mark.django_db

NOW = timezone.now()


@pytest.fixture(autouse=True)
def small_steps(monkeypatch):
    """Steps of one chunk of 10 rows; selections past 25 rows go in steps."""
    monkeypatch.setattr(operator, "CHUNK", 10)
    monkeypatch.setattr(bulk, "BULK_ROWS", 25)
    monkeypatch.setattr(bulk, "STEP_SECONDS", 0.0)


def changelist(model, **filters):
    url = reverse(f"admin:django_outbox_{model._meta.model_name}_changelist")
    return url + ("?" + "&".join(f"{k}={v}" for k, v in filters.items()) if filters else "")


def failed_messages(count, **fields):
    OutboxMessage.objects.bulk_create(
        OutboxMessage(
            type="t",
            destination="default",
            payload={},
            state=OutboxState.SEND_ERROR,
            attempts=5,
            last_error="HTTP 503",
            **fields,
        )
        for _ in range(count)
    )


def run(client, url, action, *, pages=None):
    """Post *action* on every row of the list at *url* (confirmed), then each step the
    progress pages ask for; return the last response and how many progress pages were
    shown (at most *pages*, then stop as a closed browser tab would)."""
    first = OutboxMessage.objects.values_list("pk", flat=True).first() or 1
    data = {
        "action": action,
        "select_across": "1",
        "index": "0",
        "_selected_action": [first],
        "confirmed": "yes",
    }
    shown = 0
    response = client.post(url, data)
    while response.status_code == 200 and "carry" in (response.context or {}):
        shown += 1
        assert 'id="outbox-bulk-continue"' in response.text
        if pages is not None and shown >= pages:
            return response, shown
        carry = {k: str(v) for k, v in response.context["carry"].items()}
        response = client.post(url, {**carry, "_selected_action": response.context["selected"]})
    return response, shown


def test_a_large_requeue_moves_in_steps_and_is_recorded_once(admin_client):
    failed_messages(43)
    OutboxMessage.objects.bulk_create(
        OutboxMessage(type="t", destination="default", payload={}) for _ in range(5)
    )
    url = changelist(OutboxMessage, state__exact="send_error")
    response, pages = run(admin_client, url, "requeue_messages")
    assert response.status_code == 302 and response["Location"] == url
    assert pages == 4  # 10 + 10 + 10 + 10 rows, then the last 3 and the list
    assert not OutboxMessage.objects.filter(state=OutboxState.SEND_ERROR).exists()
    requeued = OutboxMessage.objects.filter(state=OutboxState.SHOULD_BE_SENT, last_error="HTTP 503")
    assert requeued.filter(attempts=0).count() == 43
    [entry] = LogEntry.objects.all()
    assert entry.object_id is None
    assert entry.change_message == (
        "Requeued 43 of 43 selected message(s) (list: state__exact=send_error) through the "
        "admin, in steps."
    )
    assert "state__exact=send_error" in entry.object_repr
    listing = admin_client.get(url)
    assert "Requeued 43 of 43 selected message(s)" in listing.text


def test_a_step_moves_one_chunk_past_the_last_and_says_how_far_it_got(admin_client):
    failed_messages(30)
    url = changelist(OutboxMessage, state__exact="send_error")
    response, _ = run(admin_client, url, "requeue_messages", pages=1)
    assert OutboxMessage.objects.filter(state=OutboxState.SHOULD_BE_SENT).count() == 10
    assert "Requeued 10 of 30 selected message(s)" in response.text
    carry = response.context["carry"]
    tenth = OutboxMessage.objects.order_by("pk").values_list("pk", flat=True)[9]
    assert carry["bulk_after"] == tenth
    [entry] = LogEntry.objects.all()
    assert entry.change_message.endswith("in steps; still going.")
    assert carry["bulk_entry"] == entry.pk


def test_a_closed_progress_page_loses_nothing_and_the_same_action_finishes(admin_client):
    failed_messages(30)
    url = changelist(OutboxMessage, state__exact="send_error")
    run(admin_client, url, "requeue_messages", pages=2)  # the tab closed after two steps
    assert OutboxMessage.objects.filter(state=OutboxState.SEND_ERROR).count() == 10
    # Fewer than BULK_ROWS left: the same action moves them at once, row by row.
    response, pages = run(admin_client, url, "requeue_messages")
    assert pages == 0 and response.status_code == 302
    assert not OutboxMessage.objects.filter(state=OutboxState.SEND_ERROR).exists()
    bulk_entries = LogEntry.objects.filter(object_id__isnull=True)
    assert [e.change_message for e in bulk_entries] == [
        "Requeued 20 of 30 selected message(s) (list: state__exact=send_error) through the "
        "admin, in steps; still going."
    ]
    assert LogEntry.objects.filter(object_id__isnull=False).count() == 10


def test_a_large_cancel_asks_once_for_the_whole_list(admin_client):
    """The confirmation of a final action keeps "all N matching": the whole list is
    cancelled, not the page's rows."""
    failed_messages(40)
    url = changelist(OutboxMessage, state__exact="send_error")
    first = OutboxMessage.objects.values_list("pk", flat=True).first()
    data = {"action": "cancel_messages", "select_across": "1", "index": "0"}
    confirm = admin_client.post(url, {**data, "_selected_action": [first]})
    assert "All the" in confirm.text or "40 outbox messages" in confirm.text
    assert 'name="select_across" value="1"' in confirm.text
    assert "move in steps" in confirm.text
    assert OutboxMessage.objects.filter(state=OutboxState.CANCELLED).count() == 0
    response, pages = run(admin_client, url, "cancel_messages")
    assert response.status_code == 302 and pages == 4
    assert OutboxMessage.objects.filter(state=OutboxState.CANCELLED).count() == 40
    assert LogEntry.objects.count() == 1


def test_a_large_cancel_of_jobs_counts_and_records_the_running_ones(admin_client):
    Job.objects.bulk_create(
        Job(task_path="testproject.shop.jobs.noop", state=JobState.READY) for _ in range(20)
    )
    Job.objects.bulk_create(
        Job(
            task_path="testproject.shop.jobs.noop",
            state=JobState.RUNNING,
            locked_until=NOW,
            lock_token=uuid.uuid4(),
        )
        for _ in range(15)
    )
    url = changelist(Job)
    first = Job.objects.values_list("pk", flat=True).first()
    data = {"action": "cancel_jobs", "select_across": "1", "confirmed": "yes"}
    response = admin_client.post(url, {**data, "index": "0", "_selected_action": [first]})
    while response.status_code == 200:
        carry = {k: str(v) for k, v in response.context["carry"].items()}
        response = admin_client.post(url, {**carry, "_selected_action": [first]})
    assert Job.objects.filter(state=JobState.FAILED, resolution="cancelled").count() == 20
    assert Job.objects.filter(state=JobState.RUNNING, cancel_requested=True).count() == 15
    [entry] = LogEntry.objects.all()
    assert entry.change_message == (
        "Cancelled 20 of 35 selected job(s) (list: no filter (every row)); 15 running job(s) "
        "asked to stop through the admin, in steps."
    )


def test_a_large_release_of_gaps_moves_in_steps(admin_client):
    InboxMessage.objects.bulk_create(
        InboxMessage(
            source="s",
            message_id=f"m{n}",
            type="step.done",
            payload={},
            key=f"k{n}",
            sequence=5,
            last_error="waiting for sequence 4",
            state=InboxState.SHOULD_BE_HANDLED,
        )
        for n in range(30)
    )
    url = changelist(InboxMessage, gap="waiting")
    first = InboxMessage.objects.values_list("pk", flat=True).first()
    data = {"action": "release_gaps", "select_across": "1", "index": "0", "confirmed": "yes"}
    response = admin_client.post(url, {**data, "_selected_action": [first]})
    steps = 0
    while response.status_code == 200:
        steps += 1
        carry = {k: str(v) for k, v in response.context["carry"].items()}
        response = admin_client.post(url, {**carry, "_selected_action": [first]})
    assert steps == 3
    assert InboxMessage.objects.filter(last_error="gap released by an operator").count() == 30
    [entry] = LogEntry.objects.all()
    assert "Released from their gap 30 of 30 selected message(s) (list: gap=waiting)" in (
        entry.change_message
    )


def test_a_progress_page_cannot_rewrite_another_user_s_history(admin_client, django_user_model):
    other = django_user_model.objects.create_superuser("other", "o@example.com", "x")
    theirs = LogEntry.objects.create(
        user=other, object_repr="x", action_flag=2, change_message="theirs"
    )
    failed_messages(30)
    url = changelist(OutboxMessage)
    first = OutboxMessage.objects.values_list("pk", flat=True).first()
    data = {
        "action": "requeue_messages",
        "select_across": "1",
        "confirmed": "yes",
        "bulk_after": "0",
        "bulk_entry": str(theirs.pk),
        "_selected_action": [first],
    }
    admin_client.post(url, data)
    theirs.refresh_from_db()
    assert theirs.change_message == "theirs"
    assert LogEntry.objects.count() == 2


# -- the jobs' skip --------------------------------------------------------------------


def test_skip_leaves_cancelled_and_skipped_jobs_as_they_were(admin_client):
    def failed(resolution):
        return Job.objects.create(
            task_path="testproject.shop.jobs.noop",
            state=JobState.FAILED,
            finished_at=NOW,
            resolution=resolution,
        )

    cancelled, skipped, broken = failed("cancelled"), failed("skipped"), failed("")
    data = {
        "action": "skip_jobs",
        "_selected_action": [cancelled.pk, skipped.pk, broken.pk],
        "confirmed": "yes",
        "index": "0",
    }
    response = admin_client.post(changelist(Job), data, follow=True)
    assert "1 job(s) skipped" in response.text
    assert "2 job(s) left as they were" in response.text
    resolutions = dict(Job.objects.values_list("pk", "resolution"))
    assert resolutions == {cancelled.pk: "cancelled", skipped.pk: "skipped", broken.pk: "skipped"}
    assert list(LogEntry.objects.values_list("object_id", flat=True)) == [str(broken.pk)]
