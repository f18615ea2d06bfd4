"""The admin for operators, on all three parts: every state has its actions (the same on
the list and on a row's page), the inbox's and the jobs' pages have the outbox's buttons,
and a stuck row looks different from a running one."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_outbox.admin import InboxMessageAdmin, JobAdmin, OutboxMessageAdmin
from django_outbox.engine import operator
from django_outbox.engine.models import Worker
from django_outbox.jobs.models import Job, JobState
from django_outbox.models import InboxMessage, InboxState, OutboxMessage, OutboxState
from tests.factories import OutboxMessageFactory

pytestmark = pytest.mark.django_db

NOW = timezone.now()
SOON = NOW + timedelta(minutes=5)
PAST = NOW - timedelta(minutes=5)

ADMINS = {
    OutboxMessage: OutboxMessageAdmin,
    InboxMessage: InboxMessageAdmin,
    Job: JobAdmin,
}


def url(model, view, *args):
    return reverse(f"admin:django_outbox_{model._meta.model_name}_{view}", args=args)


def staff(model, *codenames):
    name = "op-" + model._meta.model_name + "-" + "-".join(codenames or ("none",))
    user = User.objects.create_user(name, is_staff=True)
    perms = Permission.objects.filter(
        content_type__app_label="django_outbox",
        codename__in=[f"view_{model._meta.model_name}", *codenames],
    )
    user.user_permissions.add(*perms)
    return user


def row(model, state, **fields):
    """A row of *model* in *state*, with what that state requires."""
    if state in (OutboxState.SENT, OutboxState.CANCELLED) or state in (
        InboxState.HANDLED,
        InboxState.SKIPPED,
        JobState.SUCCESSFUL,
        JobState.FAILED,
    ):
        fields.setdefault("finished_at", NOW)
    if state == OutboxState.SENT:
        fields.setdefault("sent_at", NOW)
    if state in (OutboxState.SENDING, JobState.RUNNING):
        fields.setdefault("locked_until", SOON)
        fields.setdefault("lock_token", uuid.uuid4())
    if model is OutboxMessage:
        return OutboxMessageFactory(state=state, **fields)
    if model is InboxMessage:
        return InboxMessage.objects.create(
            source="s", message_id=str(uuid.uuid4()), type="t", payload={}, state=state, **fields
        )
    return Job.objects.create(task_path="testproject.shop.jobs.noop", state=state, **fields)


def buttons(page):
    """The action buttons of a row's page, by label (a final one ends with "…")."""
    import re

    labels = re.findall(r'<input type="submit" value="([^"]+)" class="button"', page.text)
    labels += [link + "…" for link in re.findall(r'class="button">([A-Z][a-z]+)…</a>', page.text)]
    return sorted(labels)


# -- every state ------------------------------------------------------------------


@pytest.mark.parametrize("model", list(ADMINS), ids=lambda m: m.__name__)
def test_the_admin_s_state_map_covers_every_state(admin_client, model):
    """Given a row in each state, its page offers exactly the actions the admin's state
    map (the engine's rules) lists for that state, and the list's state filter offers
    every state."""
    from django.contrib import admin

    model_admin = admin.site._registry[model]
    state_map = model_admin.state_actions()
    states = [value for value, _ in model._meta.get_field("state").choices]
    assert sorted(state_map) == sorted(states)
    listing = admin_client.get(url(model, "changelist"))
    for state in states:
        assert f"state__exact={state}" in listing.text
        instance = row(model, state)
        page = admin_client.get(url(model, "change", instance.pk))
        assert page.status_code == 200
        expected = sorted(
            model_admin.operator_actions[name].label
            + ("…" if model_admin.operator_actions[name].final else "")
            for name in state_map[state]
            if model_admin.operator_actions[name].on_page
        )
        assert buttons(page) == expected, state
        # The engine agrees: the same actions, from the same states.
        engine = [operator.operations(model).word(v) for v in operator.verbs_from(model, state)]
        assert [name for name in state_map[state] if name != "release"] == engine


def test_the_admin_section_is_named_for_all_three_parts(admin_client):
    index = admin_client.get(reverse("admin:index"))
    assert "Outbox, inbox and jobs" in index.text
    assert ">Outbox</" not in index.text


# -- the inbox's and the jobs' pages have the outbox's buttons ------------------------


def test_an_inbox_message_s_page_requeues_and_skips_after_asking(client):
    failed = row(InboxMessage, InboxState.HANDLE_ERROR, attempts=3, last_error="boom")
    user = staff(InboxMessage, "requeue_inboxmessage", "skip_inboxmessage")
    client.force_login(user)
    requeue, skip = url(InboxMessage, "requeue", failed.pk), url(InboxMessage, "skip", failed.pk)
    page = client.get(url(InboxMessage, "change", failed.pk))
    assert f'action="{requeue}"' in page.text and f'href="{skip}"' in page.text
    client.post(requeue)
    failed.refresh_from_db()
    assert (failed.state, failed.attempts) == (InboxState.SHOULD_BE_HANDLED, 0)
    confirm = client.get(skip)
    assert "Yes, skip it" in confirm.text and "never handled" in confirm.text
    failed.refresh_from_db()
    assert failed.state == InboxState.SHOULD_BE_HANDLED  # asking changed nothing
    client.post(skip)
    failed.refresh_from_db()
    assert failed.state == InboxState.SKIPPED
    history = LogEntry.objects.filter(object_id=str(failed.pk)).order_by("pk")
    assert [e.change_message for e in history] == [
        "Requeued through the admin.",
        "Skipped through the admin.",
    ]


def test_a_job_s_page_retries_cancels_and_skips(client):
    failed = row(Job, JobState.FAILED, attempts=1, last_error="boom")
    ready = row(Job, JobState.READY)
    client.force_login(staff(Job, "retry_job", "cancel_job", "skip_job"))
    page = client.get(url(Job, "change", failed.pk))
    assert buttons(page) == ["Retry", "Skip…"]
    assert buttons(client.get(url(Job, "change", ready.pk))) == ["Cancel…"]
    assert "Yes, cancel it" in client.get(url(Job, "cancel", ready.pk)).text
    client.post(url(Job, "cancel", ready.pk))
    ready.refresh_from_db()
    assert (ready.state, ready.resolution) == (JobState.FAILED, "cancelled")
    client.post(url(Job, "skip", failed.pk))
    failed.refresh_from_db()
    assert failed.resolution == "skipped"
    client.post(url(Job, "retry", failed.pk))
    failed.refresh_from_db()
    assert (failed.state, failed.attempts) == (JobState.READY, 0)


def test_a_running_job_s_cancel_asks_it_to_stop_and_says_so(client):
    running = row(Job, JobState.RUNNING)
    client.force_login(staff(Job, "cancel_job"))
    data = {"action": "cancel_jobs", "_selected_action": [running.pk], "confirmed": "yes"}
    response = client.post(url(Job, "changelist"), data, follow=True)
    assert "0 job(s) cancelled" in response.text
    assert "1 running job(s) asked to stop" in response.text
    assert "left as they were" not in response.text
    running.refresh_from_db()
    assert (running.state, running.cancel_requested) == (JobState.RUNNING, True)
    entry = LogEntry.objects.get(object_id=str(running.pk))
    assert entry.change_message == "Asked to stop through the admin."


@pytest.mark.parametrize(
    ("model", "state", "action", "codename"),
    [
        (InboxMessage, InboxState.HANDLE_ERROR, "requeue", "skip_inboxmessage"),
        (InboxMessage, InboxState.HANDLE_ERROR, "skip", "requeue_inboxmessage"),
        (Job, JobState.FAILED, "retry", "cancel_job"),
        (Job, JobState.READY, "cancel", "retry_job"),
        (Job, JobState.FAILED, "skip", "retry_job"),
    ],
)
def test_a_row_s_page_refuses_an_action_without_its_permission(
    client, model, state, action, codename
):
    instance = row(model, state)
    client.force_login(staff(model, codename))
    target = url(model, action, instance.pk)
    assert target not in client.get(url(model, "change", instance.pk)).text
    assert client.post(target).status_code == 403
    assert client.get(target).status_code == 403
    instance.refresh_from_db()
    assert instance.state == state and not LogEntry.objects.exists()


def test_an_action_on_a_row_that_does_not_exist_is_a_404(admin_client):
    assert admin_client.post(url(Job, "retry", 999_999)).status_code == 404
    assert admin_client.post(url(Job, "retry", "not-an-id")).status_code == 404


# -- stuck or running ---------------------------------------------------------------------


def worker(name, *, silent_for=0.0):
    beat = timezone.now() - timedelta(seconds=silent_for)
    return Worker.objects.create(name=name, heartbeat_at=beat, healthy_since=beat)


@pytest.fixture
def held_messages():
    """Four messages being sent: by a live worker, past their lease, by a silent worker,
    by a worker whose row is gone."""
    live, silent = worker("host:1 celery"), worker("host:2 celery", silent_for=60)
    started = {"attempt_open": True, "attempted_at": NOW, "attempts": 1}
    return {
        "running": row(OutboxMessage, OutboxState.SENDING, claimed_by=live.pk, **started),
        "lease ran out": row(
            OutboxMessage, OutboxState.SENDING, claimed_by=live.pk, locked_until=PAST, **started
        ),
        "silent": row(OutboxMessage, OutboxState.SENDING, claimed_by=silent.pk, **started),
        "gone": row(OutboxMessage, OutboxState.SENDING, claimed_by=uuid.uuid4(), **started),
    }


def test_the_list_tells_a_stuck_message_from_a_running_one(admin_client, held_messages):
    response = admin_client.get(url(OutboxMessage, "changelist"))
    cells = {
        obj.pk: response.context["cl"].model_admin.held_by(obj)
        for obj in response.context["cl"].result_list
    }
    running = cells[held_messages["running"].pk]
    assert "host:1 celery" in running and "stuck" not in running
    assert "attempt since" in running and "lease to" in running and "s ago" in running
    for reason in ("lease ran out", "silent", "gone"):
        assert "stuck" in cells[held_messages[reason].pk], reason
    assert "host:2 celery" in cells[held_messages["silent"].pk]
    assert "a worker that is gone" in cells[held_messages["gone"].pk]
    assert response.text.count('class="outbox-stuck"') == 3


def test_the_worker_filter_finds_stuck_and_running_rows(admin_client, held_messages):
    row(OutboxMessage, OutboxState.SEND_ERROR)
    stuck = admin_client.get(url(OutboxMessage, "changelist"), {"held": "stuck"})
    expected = {held_messages[k].pk for k in ("lease ran out", "silent", "gone")}
    assert {m.pk for m in stuck.context["cl"].result_list} == expected
    running = admin_client.get(url(OutboxMessage, "changelist"), {"held": "running"})
    assert [m.pk for m in running.context["cl"].result_list] == [held_messages["running"].pk]


def test_a_stuck_message_s_page_says_who_held_it_and_why(admin_client, held_messages):
    silent = held_messages["silent"]
    page = admin_client.get(url(OutboxMessage, "change", silent.pk))
    text = page.text
    assert "host:2 celery" in text and str(silent.claimed_by) in text
    assert "has not beaten for over" in text and 'class="outbox-stuck"' in text
    assert "worker&#x27;s last heartbeat" in text.lower()
    page = admin_client.get(url(OutboxMessage, "change", held_messages["running"].pk))
    assert "running, attempt since" in page.text and 'class="outbox-stuck"' not in page.text


def test_a_page_reads_its_holders_in_one_query_whatever_it_shows(admin_client):
    """No query per row: a page of held rows costs one query more than a page without."""
    live = worker("host:1 celery")
    row(OutboxMessage, OutboxState.SEND_ERROR)
    with CaptureQueriesContext(connection) as idle:
        admin_client.get(url(OutboxMessage, "changelist"))
    row(OutboxMessage, OutboxState.SENDING, claimed_by=live.pk)
    with CaptureQueriesContext(connection) as one:
        admin_client.get(url(OutboxMessage, "changelist"))
    for _ in range(20):
        row(OutboxMessage, OutboxState.SENDING, claimed_by=worker("host:n celery").pk)
    with CaptureQueriesContext(connection) as many:
        admin_client.get(url(OutboxMessage, "changelist"))
    assert len(one) == len(idle) + 1
    assert len(many) == len(one)


def test_a_running_job_and_an_inbox_message_being_handled_show_their_worker(admin_client):
    live, silent = worker("host:1 jobs"), worker("host:2 inbox", silent_for=60)
    job = row(Job, JobState.RUNNING, claimed_by=live.pk, attempt_open=True, last_attempted_at=NOW)
    page = admin_client.get(url(Job, "change", job.pk)).text
    assert "host:1 jobs" in page and "running, attempt since" in page
    # Lock mode: a ready message under a live lease is being handled.
    handled = row(InboxMessage, InboxState.SHOULD_BE_HANDLED, claimed_by=silent.pk)
    InboxMessage.objects.filter(pk=handled.pk).update(locked_until=SOON, attempt_open=True)
    listing = admin_client.get(url(InboxMessage, "changelist"), {"held": "stuck"})
    assert [m.pk for m in listing.context["cl"].result_list] == [handled.pk]
    assert "host:2 inbox" in listing.text and 'class="outbox-stuck"' in listing.text
    # Its lease ran out: not held any more, simply due again.
    InboxMessage.objects.filter(pk=handled.pk).update(locked_until=PAST)
    listing = admin_client.get(url(InboxMessage, "changelist"), {"held": "stuck"})
    assert list(listing.context["cl"].result_list) == []


@pytest.mark.postgres
@pytest.mark.plans
def test_the_stuck_filter_reads_the_partial_index_over_running_rows(admin_client):
    """The list filtered to stuck rows reads the few rows being sent, not the history."""
    OutboxMessage.objects.bulk_create(
        OutboxMessage(
            type="t",
            destination="default",
            payload={},
            state=OutboxState.SENT,
            sent_at=NOW,
            finished_at=NOW,
        )
        for _ in range(20_000)
    )
    row(OutboxMessage, OutboxState.SENDING, locked_until=PAST)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_outbox_message")
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(url(OutboxMessage, "changelist"), {"held": "stuck"})
    assert len(response.context["cl"].result_list) == 1
    [listing] = [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].startswith('SELECT "django_outbox_message"."id"') and "LIMIT" in q["sql"]
    ]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + listing)
        plan = "\n".join(line for (line,) in cursor.fetchall())
    assert "Seq Scan on django_outbox_message" not in plan, plan
