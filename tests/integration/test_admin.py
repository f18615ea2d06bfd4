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


def post_action(client, action, messages, *, confirmed=True):
    data = {"action": action, "_selected_action": [m.pk for m in messages]}
    if confirmed:
        data["confirmed"] = "yes"
    return client.post(reverse(CHANGELIST), data, follow=True)


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
    assert "1 message(s) left as they were" in response.text
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


CHANGE = "admin:django_outbox_outboxmessage_change"


def test_cancel_asks_for_confirmation_first(client, failed):
    client.force_login(staff("cancel_outboxmessage"))
    response = post_action(client, "cancel_messages", [failed], confirmed=False)
    assert "Yes, cancel them" in response.text and "cannot be undone" in response.text
    failed.refresh_from_db()
    assert failed.state == OutboxState.SEND_ERROR


def test_requeue_and_cancel_are_recorded_in_the_history(client, failed):
    from django.contrib.admin.models import LogEntry

    user = staff("requeue_outboxmessage", "cancel_outboxmessage")
    client.force_login(user)
    post_action(client, "requeue_messages", [failed])
    post_action(client, "cancel_messages", [failed])
    entries = LogEntry.objects.filter(object_id=str(failed.pk)).order_by("pk")
    assert [(e.user_id, e.change_message) for e in entries] == [
        (user.pk, "Requeued through the admin."),
        (user.pk, "Cancelled through the admin."),
    ]
    history = client.get(reverse("admin:django_outbox_outboxmessage_history", args=[failed.pk]))
    assert "Requeued through the admin." in history.text


def test_a_long_error_is_wrapped_not_clipped_and_text_is_not_escaped(client):
    error = "Traceback (most recent call last):\n" + "x" * 3000 + " THE END"
    message = OutboxMessageFactory(
        state=OutboxState.SEND_ERROR, last_error=error, payload={"city": "Zürich"}
    )
    client.force_login(staff())
    response = client.get(reverse(CHANGE, args=[message.pk]))
    assert "white-space: pre-wrap" in response.text
    assert "THE END" in response.text
    assert "Zürich" in response.text and "\\u00fc" not in response.text


def test_the_list_shows_a_short_error_and_filters_by_error_and_attempts(client, failed):
    OutboxMessageFactory(attempts=0)
    client.force_login(staff())
    response = client.get(reverse(CHANGELIST), {"has_error": "yes"})
    assert list(response.context["cl"].result_list) == [failed]
    assert "HTTP 503" in response.text
    response = client.get(reverse(CHANGELIST), {"attempts": "2-5"})
    assert list(response.context["cl"].result_list) == [failed]


def test_search_says_what_it_searches_and_matches_key_and_type_prefixes(client):
    keyed = OutboxMessageFactory(key="order:1234", sequence=1, type="order.created")
    OutboxMessageFactory(key="invoice:9", sequence=1, type="invoice.paid")
    client.force_login(staff())
    for term in ("order:12", "type:order.cr", str(keyed.message_id)):
        response = client.get(reverse(CHANGELIST), {"q": term})
        assert list(response.context["cl"].result_list) == [keyed], term
    assert "or the start of a key" in response.text
    assert client.get(reverse(CHANGELIST), {"q": "not-a-uuid"}).status_code == 200


def test_the_messages_own_page_requeues_and_cancels(client, failed):
    client.force_login(staff("requeue_outboxmessage", "cancel_outboxmessage"))
    requeue, cancel = (
        reverse(f"admin:django_outbox_outboxmessage_{verb}", args=[failed.pk])
        for verb in ("requeue", "cancel")
    )
    page = client.get(reverse(CHANGE, args=[failed.pk]))
    assert f'action="{requeue}"' in page.text and f'href="{cancel}"' in page.text
    client.post(requeue)
    failed.refresh_from_db()
    assert failed.state == OutboxState.SHOULD_BE_SENT
    confirm = client.get(cancel)
    assert "Yes, cancel it" in confirm.text
    failed.refresh_from_db()
    assert failed.state == OutboxState.SHOULD_BE_SENT  # asking changed nothing
    client.post(cancel)
    failed.refresh_from_db()
    assert failed.state == OutboxState.CANCELLED


def test_the_messages_own_page_refuses_without_the_permission(client, failed):
    client.force_login(staff())
    requeue = reverse("admin:django_outbox_outboxmessage_requeue", args=[failed.pk])
    page = client.get(reverse(CHANGE, args=[failed.pk]))
    assert requeue not in page.text
    response = client.post(requeue)
    assert response.status_code == 403
    failed.refresh_from_db()
    assert failed.state == OutboxState.SEND_ERROR


def test_a_failed_keyed_message_links_to_what_waits_behind_it(client):
    head = OutboxMessageFactory(
        state=OutboxState.SEND_ERROR, key="order:1", sequence=1, last_error="boom"
    )
    for sequence in (2, 3):
        OutboxMessageFactory(key="order:1", sequence=sequence, blocked=True)
    client.force_login(staff())
    page = client.get(reverse(CHANGE, args=[head.pk]))
    assert "2 message(s) of this key" in page.text
    assert "key=order:1" in page.text


@pytest.mark.postgres
def test_the_unfiltered_list_does_not_count_a_large_table(client, django_assert_max_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    OutboxMessage.objects.bulk_create(
        OutboxMessage(type="t", destination="default", payload={}) for _ in range(12_000)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_outbox_message")
    client.force_login(staff())
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    assert not [q for q in queries if "COUNT(" in q["sql"].upper()], queries.captured_queries
    assert response.context["cl"].paginator.count > 10_000
