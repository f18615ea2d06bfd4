"""Admin actions: a refused or inapplicable action changes nothing and says why."""

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_outbox.models import OutboxMessage, OutboxState
from tests.badinput.cases import ADMIN, REFUSED, UNCHANGED
from tests.badinput.support import params, table_counts
from tests.factories import OutboxMessageFactory

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_outbox_outboxmessage_changelist"
ALL = ("view_outboxmessage", "requeue_outboxmessage", "cancel_outboxmessage")


def logged_in(codenames):
    user = User.objects.create_user("operator", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="django_outbox", codename__in=codenames)
    )
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def states():
    return sorted(OutboxMessage.objects.values_list("pk", "state", "attempts"))


@pytest.mark.parametrize("case", params(ADMIN))
def test_admin_action(case):
    given = case.given
    row = OutboxMessageFactory(state=given.get("state", OutboxState.SEND_ERROR), attempts=5)
    client = logged_in(
        given.get("permissions", ("view_outboxmessage", *ALL[1:])) or ("view_outboxmessage",)
    )
    before, rows_before = table_counts(), states()
    if "row_url" in given:
        object_id = {"row": str(row.pk), "missing": str(row.pk + 1000)}.get(
            given["row_url"], given["row_url"]
        )
        response = client.post(f"{reverse(CHANGELIST)}{object_id}/requeue/", {"confirmed": "yes"})
    else:
        selected = given.get("selected", [str(row.pk)])
        data = {"action": given["action"], "_selected_action": selected, "confirmed": "yes"}
        response = client.post(reverse(CHANGELIST), data, follow=True)
    expect = case.expect
    assert response.status_code == int(expect.what)
    if expect.kind == UNCHANGED:
        said = " ".join(str(m) for m in response.context["messages"])
        assert expect.says in said, said
    else:
        assert expect.kind == REFUSED
    assert (table_counts(), states()) == (before, rows_before)
