"""The admin's health page: who may open it and what each operator sees, the chart, the
workers, and a failure group requeued, skipped or retried as a whole after a
confirmation, behind the part's permission, logged once."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_outbox.inbox.models import InboxMessage, InboxState
from django_outbox.jobs.models import Job, JobState
from django_outbox.outbox.models import OutboxMessage, OutboxState
from tests import health_rows as make

pytestmark = pytest.mark.django_db

PAGE = "admin:django_outbox_health_changelist"
GROUP = "admin:django_outbox_health_group"


@pytest.fixture
def now():
    return make.pinned_now()


def staff(*codenames):
    user = User.objects.create_user("-".join(codenames) or "nobody", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="django_outbox", codename__in=codenames)
    )
    return user


def failed_outbox(now, count=3, error="HTTP 503", destination="billing"):
    return [
        make.outbox(now, OutboxState.SEND_ERROR, destination=destination, last_error=error)
        for _ in range(count)
    ]


def group_url(**query):
    from urllib.parse import urlencode

    return f"{reverse(GROUP)}?{urlencode(query)}"


def test_the_page_is_for_staff_who_may_view_a_part(client):
    page = reverse(PAGE)
    assert client.get(page).status_code == 302  # to the login page
    client.force_login(staff())
    assert client.get(page).status_code == 403
    client.force_login(staff("view_job"))
    response = client.get(page)
    assert response.status_code == 200
    # Only the jobs are shown to someone who may view only them.
    assert 'id="part-jobs"' in response.text
    assert 'id="part-outbox"' not in response.text and 'id="part-inbox"' not in response.text


def test_the_index_and_each_list_link_to_the_page(admin_client):
    page = reverse(PAGE)
    assert f'href="{page}"' in admin_client.get(reverse("admin:index")).text
    for model in ("outboxmessage", "inboxmessage", "job"):
        listing = admin_client.get(reverse(f"admin:django_outbox_{model}_changelist"))
        assert f'href="{page}"' in listing.text, model


def test_the_page_shows_figures_chart_workers_and_groups(admin_client, now):
    failed_outbox(now)
    make.counted(now, "outbox", "done", 30)
    make.counted(now, "outbox", "dead", 3, minutes_ago=2)
    dead = make.worker(now, "jobs", silent=60)
    make.job(now, JobState.RUNNING, claimed_by=dead.id, last_attempted_at=make.ago(now, 61))

    with CaptureQueriesContext(connection) as queries:
        text = admin_client.get(reverse(PAGE)).text

    # Bounded: the same few queries whatever the tables hold.
    assert len(queries) < 70, len(queries)
    assert "send_error: <strong>3</strong>" in text
    # The chart: one polyline per series, sixty points each, with the hour's totals.
    charts = re.findall(r"<svg [^>]*class=\"outbox-chart\"", text)
    assert len(charts) == 3
    done = re.search(
        r'class="series series-done" data-series="done" data-total="30" '
        r'points="([^"]+)"',
        text,
    )
    assert done is not None and len(done.group(1).split()) == 60
    assert 'data-series="failed" data-total="3"' in text
    assert "<script" not in text.split('id="outbox-health"')[1]
    # The dead worker, stuck, with the job it holds.
    assert re.search(r"dead: stuck</strong>.*?1 jobs row\(s\)", text, re.S)
    # The failure group, with its actions for a superuser.
    assert "<code>HTTP 503</code>" in text
    assert group_url(part="outbox", kind="HTTP 503", target="billing", verb="requeue") in (
        text.replace("&amp;", "&")
    )


def test_a_viewer_sees_no_group_action_and_cannot_post_one(client, now):
    rows = failed_outbox(now)
    client.force_login(staff("view_outboxmessage"))
    text = client.get(reverse(PAGE)).text
    assert "<code>HTTP 503</code>" in text
    assert reverse(GROUP) not in text
    query = {"part": "outbox", "kind": "HTTP 503", "target": "billing", "verb": "requeue"}
    assert client.get(group_url(**query)).status_code == 403
    assert client.post(reverse(GROUP), {**query, "confirmed": "yes"}).status_code == 403
    assert {m.state for m in OutboxMessage.objects.filter(pk__in=[r.pk for r in rows])} == {
        OutboxState.SEND_ERROR
    }
    assert not LogEntry.objects.exists()


def test_a_group_is_requeued_after_a_confirmation_and_logged_once(client, now):
    group = failed_outbox(now)
    other = failed_outbox(now, count=1, error="HTTP 400")[0]
    operator = staff("view_outboxmessage", "requeue_outboxmessage")
    client.force_login(operator)
    query = {"part": "outbox", "kind": "HTTP 503", "target": "billing", "verb": "requeue"}

    # Asking shows what would move, and moves nothing;
    confirm = client.get(group_url(**query))
    assert confirm.status_code == 200
    assert '<strong class="group-count">3</strong>' in confirm.text
    assert "Yes, requeue them" in confirm.text
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {OutboxState.SEND_ERROR}

    # confirming requeues the group alone, and says so once in the history.
    response = client.post(reverse(GROUP), {**query, "confirmed": "yes"}, follow=True)
    assert response.redirect_chain[-1][0] == reverse(PAGE)
    assert "3 outbox messages requeued (HTTP 503 at billing)." in response.text
    states = dict(OutboxMessage.objects.values_list("pk", "state"))
    assert {states[m.pk] for m in group} == {OutboxState.SHOULD_BE_SENT}
    assert states[other.pk] == OutboxState.SEND_ERROR
    (entry,) = LogEntry.objects.all()
    assert entry.user == operator
    assert entry.object_repr == "HTTP 503 at destination billing"
    assert entry.change_message == (
        "Requeued 3 of the 3 failed outbox messages of the group "
        "'HTTP 503 at destination billing' through the health page."
    )


def test_a_post_without_confirmation_changes_nothing(client, now):
    failed_outbox(now)
    client.force_login(staff("view_outboxmessage", "requeue_outboxmessage"))
    query = {"part": "outbox", "kind": "HTTP 503", "target": "billing", "verb": "requeue"}
    assert client.post(reverse(GROUP), query).status_code == 200  # the confirmation again
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {OutboxState.SEND_ERROR}


def test_an_inbox_group_is_skipped_and_a_jobs_group_retried(client, now):
    for _ in range(2):
        make.inbox(now, InboxState.HANDLE_ERROR, last_error="KeyError: 'sku'")
    path = make.failed_job(now, "builtins.ValueError").task_path
    client.force_login(staff("view_inboxmessage", "skip_inboxmessage", "view_job", "retry_job"))
    text = client.get(reverse(PAGE)).text.replace("&amp;", "&")
    assert group_url(part="inbox", kind="KeyError", target="shop", verb="skip") in text
    assert group_url(part="inbox", kind="KeyError", target="shop", verb="requeue") not in text
    client.post(
        reverse(GROUP),
        {"part": "inbox", "kind": "KeyError", "target": "shop", "verb": "skip", "confirmed": "1"},
    )
    assert set(InboxMessage.objects.values_list("state", flat=True)) == {InboxState.SKIPPED}
    client.post(
        reverse(GROUP),
        {
            "part": "jobs",
            "kind": "builtins.ValueError",
            "target": path,
            "verb": "retry",
            "confirmed": "1",
        },
    )
    assert Job.objects.get().state == JobState.READY
    assert LogEntry.objects.count() == 2


def test_an_unknown_verb_is_not_found(admin_client):
    query = {"part": "outbox", "kind": "x", "target": "y", "verb": "skip"}
    assert admin_client.get(group_url(**query)).status_code == 404


def test_the_page_refreshes_when_asked(admin_client):
    page = reverse(PAGE)
    assert 'http-equiv="refresh"' not in admin_client.get(page).text
    assert '<meta http-equiv="refresh" content="15">' in admin_client.get(page + "?refresh=15").text
    assert 'content="5"' in admin_client.get(page + "?refresh=1").text


def test_each_group_links_to_its_part_s_list_filtered_to_its_rows(admin_client, now):
    mine = failed_outbox(now, count=1)[0]
    failed_outbox(now, count=1, destination="search")
    message = make.inbox(now, InboxState.HANDLE_ERROR, last_error="KeyError: 'sku'")
    make.inbox(now, InboxState.HANDLE_ERROR, last_error="ValueError: no")
    job = make.failed_job(now, "builtins.ValueError", task_path="shop.jobs.bill")
    make.failed_job(now, "builtins.ValueError", task_path="shop.jobs.other")
    page = admin_client.get(reverse(PAGE)).text.replace("&amp;", "&")
    for model, row, marker in (
        ("outboxmessage", mine, "destination=billing"),
        ("inboxmessage", message, "last_error__startswith=KeyError"),
        ("job", job, "task_path=shop.jobs.bill"),
    ):
        changelist = reverse(f"admin:django_outbox_{model}_changelist")
        (link,) = re.findall(rf'href="({re.escape(changelist)}\?[^"]*{marker}[^"]*)"', page)
        listing = admin_client.get(link)
        assert listing.status_code == 200, link
        shown = set(re.findall(r'name="_selected_action" value="(\d+)"', listing.text))
        assert shown == {str(row.pk)}, (link, shown)
