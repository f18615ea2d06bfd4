"""The URLs of a row's actions (``…/<id>/<action>/``) on the three parts: the permissions
are checked before anything is read (a user who may not act gets the same 403 for any
id, existing, missing or malformed, and never a 500), the list's view permission is
needed too, and a permitted user gets one 404 for a malformed id and a missing row."""

from __future__ import annotations

import uuid

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_outbox.admin.actions import row_id
from django_outbox.jobs.models import Job, JobState
from django_outbox.models import InboxMessage, InboxState, OutboxMessage, OutboxState
from tests.factories import OutboxMessageFactory

pytestmark = pytest.mark.django_db

#: Ids that name no row as the admin writes them (each parses as a number somewhere:
#: ``int()`` takes the spaces, the sign, the underscore and the Arabic-Indic one).
MALFORMED = ["abc", "1.0", "%201", "+1", "1_0", "01", "-1", "\u0661", "9" * 30, str(2**63)]

#: A row in a state each action applies to, per model.
ACTIONABLE = {
    OutboxMessage: {"requeue": OutboxState.SEND_ERROR, "cancel": OutboxState.SEND_ERROR},
    InboxMessage: {"requeue": InboxState.HANDLE_ERROR, "skip": InboxState.HANDLE_ERROR},
    Job: {"retry": JobState.FAILED, "cancel": JobState.READY, "skip": JobState.FAILED},
}
#: The permission each action needs.
CODENAMES = {
    (OutboxMessage, "requeue"): "requeue_outboxmessage",
    (OutboxMessage, "cancel"): "cancel_outboxmessage",
    (InboxMessage, "requeue"): "requeue_inboxmessage",
    (InboxMessage, "skip"): "skip_inboxmessage",
    (Job, "retry"): "retry_job",
    (Job, "cancel"): "cancel_job",
    (Job, "skip"): "skip_job",
}
CASES = [(model, action) for model, actions in ACTIONABLE.items() for action in actions]


def case_id(case):
    return case.__name__ if isinstance(case, type) else str(case)


def make_row(model, state):
    now = timezone.now()
    if model is OutboxMessage:
        return OutboxMessageFactory(state=state)
    if model is InboxMessage:
        return InboxMessage.objects.create(
            source="s", message_id=str(uuid.uuid4()), type="t", payload={}, state=state
        )
    finished = {"finished_at": now} if state == JobState.FAILED else {}
    return Job.objects.create(task_path="testproject.shop.jobs.noop", state=state, **finished)


def action_url(model, action, object_id):
    base = reverse(f"admin:django_outbox_{model._meta.model_name}_changelist")
    return f"{base}{object_id}/{action}/"


def logged_in(*codenames):
    user = User.objects.create_user("op-" + "-".join(codenames or ("none",)), is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="django_outbox", codename__in=codenames)
    )
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def ids_to_try(row):
    return [str(row.pk), str(row.pk + 1000), *MALFORMED]


def test_every_row_action_of_every_part_is_covered():
    on_page = {
        (model, name)
        for model in ACTIONABLE
        for name, action in admin.site._registry[model].operator_actions.items()
        if action.on_page
    }
    assert on_page == set(CASES)


@pytest.mark.parametrize(("model", "action"), CASES, ids=case_id)
@pytest.mark.parametrize(
    "permissions",
    ["none", "view only", "action only", "view and another action"],
)
def test_a_user_who_may_not_act_gets_403_for_any_id(model, action, permissions):
    """Given a staff user missing the view or the action's permission, when they GET or
    POST the action's URL with an existing, a missing or a malformed id, then each answer
    is the same 403, and nothing changed."""
    row = make_row(model, ACTIONABLE[model][action])
    view = f"view_{model._meta.model_name}"
    others = [c for (m, a), c in CODENAMES.items() if m is model and a != action]
    codenames = {
        "none": [],
        "view only": [view],
        "action only": [CODENAMES[model, action]],
        "view and another action": [view, *others],
    }[permissions]
    client = logged_in(*codenames)
    answers = set()
    for object_id in ids_to_try(row):
        for method in (client.get, client.post):
            response = method(action_url(model, action, object_id))
            answers.add((response.status_code, response.content))
    assert [status for status, _ in answers] == [403], answers
    row.refresh_from_db()
    assert row.state == ACTIONABLE[model][action]
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize(("model", "action"), CASES, ids=case_id)
def test_a_permitted_user_gets_one_404_for_a_malformed_id_and_a_missing_row(model, action):
    row = make_row(model, ACTIONABLE[model][action])
    client = logged_in(f"view_{model._meta.model_name}", CODENAMES[model, action])
    missing = str(row.pk + 1000)
    answers = {}
    for object_id in [missing, *MALFORMED]:
        for method in ("get", "post"):
            response = getattr(client, method)(action_url(model, action, object_id))
            answers[object_id, method] = (response.status_code, response.content)
    assert set(answers.values()) == {answers[missing, "get"]}, answers
    assert answers[missing, "get"][0] == 404
    row.refresh_from_db()
    assert row.state == ACTIONABLE[model][action]


@pytest.mark.parametrize(("model", "action"), CASES, ids=case_id)
def test_a_permitted_user_acts_on_the_row(model, action):
    """Given the view and the action's permissions, a GET asks first (final actions) or
    leads back to the row's page, and a POST moves the row and writes its history."""
    state = ACTIONABLE[model][action]
    row = make_row(model, state)
    client = logged_in(f"view_{model._meta.model_name}", CODENAMES[model, action])
    page = reverse(f"admin:django_outbox_{model._meta.model_name}_change", args=[row.pk])
    asked = client.get(action_url(model, action, row.pk))
    assert asked.status_code in (200, 302)
    if asked.status_code == 302:
        assert asked["Location"] == page
    else:
        assert f"Yes, {action} it" in asked.text
    row.refresh_from_db()
    assert row.state == state  # asking changed nothing
    done = client.post(action_url(model, action, row.pk))
    assert (done.status_code, done["Location"]) == (302, page)
    moved = type(row).objects.get(pk=row.pk)
    assert (moved.state, getattr(moved, "resolution", "")) != (state, "")
    assert LogEntry.objects.filter(object_id=str(row.pk)).count() == 1


def test_a_row_s_page_is_not_read_for_a_user_without_the_view_permission():
    row = make_row(OutboxMessage, OutboxState.SEND_ERROR)
    client = logged_in("requeue_outboxmessage", "cancel_outboxmessage")
    page = reverse("admin:django_outbox_outboxmessage_change", args=[row.pk])
    response = client.get(page)
    assert response.status_code == 403
    assert str(row.message_id) not in response.text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", 1),
        ("4711", 4711),
        (str(2**63 - 1), 2**63 - 1),
        (str(2**63), None),
        ("0", None),
        ("01", None),
        (" 1", None),
        ("1 ", None),
        ("+1", None),
        ("-1", None),
        ("1_0", None),
        ("1.0", None),
        ("\u0661", None),
        ("", None),
        ("abc", None),
    ],
)
def test_row_id_reads_only_ids_as_the_admin_writes_them(text, expected):
    assert row_id(text) == expected


@pytest.mark.parametrize("selected", [["abc"], ["1.5"], [str(2**70)], ["+1"]])
def test_a_list_action_on_forged_row_ids_is_a_bad_request(selected):
    row = make_row(OutboxMessage, OutboxState.SEND_ERROR)
    client = logged_in("view_outboxmessage", "requeue_outboxmessage")
    changelist = reverse("admin:django_outbox_outboxmessage_changelist")
    data = {"action": "requeue_messages", "_selected_action": [str(row.pk), *selected]}
    assert client.post(changelist, data).status_code == 400
    # Without the action's permission, Django's answer: the list, as if nothing was posted.
    client = logged_in("view_outboxmessage")
    assert client.post(changelist, data).status_code == 200
    row.refresh_from_db()
    assert row.state == OutboxState.SEND_ERROR
