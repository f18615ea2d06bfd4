"""Admin: requeue/cancel through the admin's URLs, guarded by dedicated permissions."""

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from django_outbox.models import OutboxMessage, OutboxState
from tests.factories import OutboxMessageFactory

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_outbox_outboxmessage_changelist"


def staff(*codenames):
    user = User.objects.create_user("op-" + "-".join(codenames or ("none",)), is_staff=True)
    perms = Permission.objects.filter(
        content_type__app_label="django_outbox", codename__in=["view_outboxmessage", *codenames]
    )
    user.user_permissions.add(*perms)
    return user


def post_action(client, action, messages):
    return client.post(
        reverse(CHANGELIST),
        {"action": action, "_selected_action": [m.pk for m in messages]},
        follow=True,
    )


@pytest.fixture
def failed():
    return OutboxMessageFactory(state=OutboxState.SEND_ERROR, attempts=5, last_error="HTTP 503")


def test_changelist_filters_and_searches(client, failed):
    client.force_login(staff())
    OutboxMessageFactory(state=OutboxState.SHOULD_BE_SENT, type="other.type")
    response = client.get(reverse(CHANGELIST), {"state": "send_error"})
    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == [failed]
    response = client.get(reverse(CHANGELIST), {"q": str(failed.message_id)})
    assert list(response.context["cl"].result_list) == [failed]


def test_detail_shows_payload_and_last_error_read_only(client, failed):
    client.force_login(staff())
    response = client.get(reverse("admin:django_outbox_outboxmessage_change", args=[failed.pk]))
    assert response.status_code == 200
    assert "HTTP 503" in response.text
    assert "&quot;n&quot;" in response.text  # the pretty-printed payload
    assert 'name="_save"' not in response.text


def test_requeue_with_permission_resets_attempts(client, failed):
    client.force_login(staff("requeue_outboxmessage"))
    response = post_action(client, "requeue_messages", [failed])
    assert "1 message(s) requeued" in response.text
    failed.refresh_from_db()
    assert (failed.state, failed.attempts) == (OutboxState.SHOULD_BE_SENT, 0)


def test_requeue_skips_messages_not_in_send_error(client, failed):
    sent = OutboxMessageFactory(
        state=OutboxState.SENT, sent_at="2026-01-01T00:00Z", finished_at="2026-01-01T00:00Z"
    )
    client.force_login(staff("requeue_outboxmessage"))
    response = post_action(client, "requeue_messages", [failed, sent])
    assert "1 message(s) skipped" in response.text
    sent.refresh_from_db()
    assert sent.state == OutboxState.SENT


def test_requeue_without_permission_is_refused(client, failed):
    client.force_login(staff("cancel_outboxmessage"))
    response = client.get(reverse(CHANGELIST))
    assert "requeue_messages" not in response.text
    post_action(client, "requeue_messages", [failed])
    failed.refresh_from_db()
    assert failed.state == OutboxState.SEND_ERROR


def test_cancel_with_permission(client, failed):
    pending = OutboxMessageFactory()
    client.force_login(staff("cancel_outboxmessage"))
    post_action(client, "cancel_messages", [failed, pending])
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {OutboxState.CANCELLED}
    assert not OutboxMessage.objects.filter(finished_at__isnull=True).exists()


def test_cancel_without_permission_is_refused(client, failed):
    client.force_login(staff("requeue_outboxmessage"))
    post_action(client, "cancel_messages", [failed])
    failed.refresh_from_db()
    assert failed.state == OutboxState.SEND_ERROR


def test_sending_messages_cannot_be_cancelled(client):
    sending = OutboxMessageFactory(
        state=OutboxState.SENDING,
        locked_until="2030-01-01T00:00Z",
        lock_token="7e9c9e0e-0000-4000-8000-000000000000",
    )
    client.force_login(staff("cancel_outboxmessage"))
    post_action(client, "cancel_messages", [sending])
    sending.refresh_from_db()
    assert sending.state == OutboxState.SENDING


def test_nobody_adds_or_deletes_messages_through_the_admin(admin_client, failed):
    assert admin_client.get(reverse("admin:django_outbox_outboxmessage_add")).status_code == 403
    response = admin_client.get(
        reverse("admin:django_outbox_outboxmessage_delete", args=[failed.pk])
    )
    assert response.status_code == 403


def test_admin_state_filter_covers_every_state(admin_client):
    response = admin_client.get(reverse(CHANGELIST))
    for state in OutboxState:
        assert f"state__exact={state.value}" in response.text
