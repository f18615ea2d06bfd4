"""The inbox's admin: a failed message with its traceback, requeued by an operator who
holds the permission (refused without it), then handled; skip asks first; gaps released."""

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.urls import reverse

import django_outbox
from django_outbox.inbox.handlers import handler, unregister
from django_outbox.inbox.handling import Inbox
from django_outbox.models import InboxMessage, InboxState

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:django_outbox_inboxmessage_changelist"


def staff(*codenames):
    user = User.objects.create_user("op-" + "-".join(codenames or ("none",)), is_staff=True)
    perms = Permission.objects.filter(
        content_type__app_label="django_outbox", codename__in=["view_inboxmessage", *codenames]
    )
    user.user_permissions.add(*perms)
    return user


def act(client, action, messages, *, confirmed=True):
    data = {"action": action, "_selected_action": [m.pk for m in messages]}
    if confirmed:
        data["confirmed"] = "yes"
    return client.post(reverse(CHANGELIST), data, follow=True)


@pytest.fixture
def flaky():
    """A handler that fails until told otherwise."""
    state = {"fail": True}

    @handler("invoice.paid")
    def paid(message):
        if state["fail"]:
            raise RuntimeError("ledger is locked")

    yield state
    unregister("invoice.paid")


def test_a_failed_message_is_shown_with_its_traceback_and_requeued_by_permission(client, flaky):
    message, _ = django_outbox.receive("invoice.paid", {"n": 1}, source="billing", message_id="i1")
    Inbox().drain()
    client.force_login(staff())
    response = client.get(reverse(CHANGELIST), {"state": "handle_error"})
    assert [m.pk for m in response.context["cl"].result_list] == [message.pk]
    page = client.get(reverse("admin:django_outbox_inboxmessage_change", args=[message.pk]))
    assert "RuntimeError: ledger is locked" in page.text
    assert "Traceback (most recent call last)" in page.text

    # Without the permission: no action, and a forged POST changes nothing.
    assert "requeue_messages" not in response.text
    act(client, "requeue_messages", [message])
    message.refresh_from_db()
    assert message.state == InboxState.HANDLE_ERROR

    client.force_login(staff("requeue_inboxmessage"))
    response = act(client, "requeue_messages", [message])
    assert "1 message(s) requeued" in response.text
    message.refresh_from_db()
    assert (message.state, message.attempts) == (InboxState.SHOULD_BE_HANDLED, 0)
    assert LogEntry.objects.filter(object_id=str(message.pk)).exists()

    flaky["fail"] = False  # the fix is deployed
    assert Inbox().drain().done == 1
    message.refresh_from_db()
    assert message.state == InboxState.HANDLED


def test_skip_asks_for_confirmation_first(client, flaky):
    message, _ = django_outbox.receive("invoice.paid", {}, source="billing", message_id="i2")
    Inbox().drain()
    client.force_login(staff("skip_inboxmessage"))
    page = act(client, "skip_messages", [message], confirmed=False)
    assert "Are you sure you want to skip these?" in page.text
    message.refresh_from_db()
    assert message.state == InboxState.HANDLE_ERROR
    act(client, "skip_messages", [message])
    message.refresh_from_db()
    assert message.state == InboxState.SKIPPED
    assert message.last_error == "skipped by an operator"


def test_an_operator_releases_a_strict_key_from_its_gap(client):
    @handler("step.done", ordering="strict")
    def step(message):
        pass

    try:
        waiting, _ = django_outbox.receive(
            "step.done", {}, source="s", message_id="s5", key="k", sequence=5
        )
        Inbox().drain()
        client.force_login(staff("requeue_inboxmessage"))
        response = client.get(reverse(CHANGELIST), {"gap": "waiting"})
        assert [m.pk for m in response.context["cl"].result_list] == [waiting.pk]
        act(client, "release_gaps", [waiting])
        assert Inbox().drain().done == 1
        waiting.refresh_from_db()
        assert waiting.state == InboxState.HANDLED
        # A late sequence 4 is now older than the cursor: skipped, not handled.
        late, _ = django_outbox.receive(
            "step.done", {}, source="s", message_id="s4", key="k", sequence=4
        )
        Inbox().drain()
        late.refresh_from_db()
        assert late.state == InboxState.SKIPPED
    finally:
        unregister("step.done")
    assert InboxMessage.objects.count() == 2


def test_the_source_filter_lists_configured_sources_and_sources_with_rows(
    client, configure_outbox, django_assert_max_num_queries
):
    """Given a declared kombu source, a local destination into an undeclared source and
    rows from a source that only receive() knew, the filter offers each of them once."""
    configure_outbox(
        DESTINATIONS={"self": {"TRANSPORT": "local", "SOURCE": "loopback"}},
        INBOX={"SOURCES": {"orders": {"TRANSPORT": "kombu", "URL": "amqp://x", "QUEUE": "q"}}},
    )
    for n in range(3):
        django_outbox.receive("t", {}, source="partner", message_id=f"p{n}", trigger=False)
    django_outbox.receive("t", {}, source="orders", message_id="o1", trigger=False)
    client.force_login(staff())

    response = client.get(reverse(CHANGELIST))

    [source_filter] = [f for f in response.context["cl"].filter_specs if f.title == "source"]
    offered = [value for value, _ in source_filter.lookup_choices]
    assert offered == ["celery-task", "loopback", "orders", "partner"]
    filtered = client.get(reverse(CHANGELIST), {"source": "partner"})
    assert len(filtered.context["cl"].result_list) == 3


def test_stored_sources_cost_one_query_per_source(django_assert_num_queries):
    for n, source in enumerate(("b", "a", "c", "a", "b")):
        django_outbox.receive("t", {}, source=source, message_id=f"m{n}", trigger=False)
    with django_assert_num_queries(4):  # a, b, c, then the seek that finds none
        assert InboxMessage.objects.sources() == ["a", "b", "c"]
    assert InboxMessage.objects.sources(limit=2) == ["a", "b"]
