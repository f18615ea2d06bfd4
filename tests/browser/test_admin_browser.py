"""The outbox admin as an operator uses it, in a real browser against a live server.

An operator with the requeue and cancel permissions logs in through the login form,
filters the list down to the failed messages, reads a long error (wrapped, its end
visible), requeues from the message's page and cancels from the list after confirming.
A viewer sees neither button nor action, and posting them anyway changes nothing.
Each step is checked on the page and in the database.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone

from django_outbox.outbox.models import OutboxMessage, OutboxState
from tests.browser.conftest import VIEWPORT
from tests.factories import OutboxMessageFactory

try:
    from playwright.sync_api import expect
except ImportError:  # the chromium fixture fails or skips the tests and says why
    expect = None

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"
CHANGELIST = "admin:django_outbox_outboxmessage_changelist"

#: The end of a real-looking error: one long line with nowhere to break it.
LAST_LINE = (
    "httpx.HTTPStatusError: Server error '503 Service Unavailable' for url "
    "'https://hooks.example.com/orders/" + "7f3a9c" * 60 + "' (THE END)"
)
LONG_ERROR = (
    "Traceback (most recent call last):\n"
    + '  File "django_outbox/outbox/transports/http.py", line 120, in publish\n' * 30
    + LAST_LINE
)

#: Where the end of the error's text is drawn, against the boxes that could clip it.
END_OF_TEXT_JS = """pre => {
    const node = pre.lastChild;
    const range = document.createRange();
    range.setStart(node, node.length - 1);
    range.setEnd(node, node.length);
    const box = rect => ({left: rect.left, right: rect.right});
    return {
        lastCharacter: box(range.getBoundingClientRect()),
        pre: box(pre.getBoundingClientRect()),
        row: box(pre.closest('.form-row').getBoundingClientRect()),
        hiddenWidth: pre.scrollWidth - pre.clientWidth,
    };
}"""

#: POSTs each URL the way a hand-made form would, with the page's CSRF token.
POST_JS = """async posts => {
    const token = document.querySelector('[name=csrfmiddlewaretoken]').value;
    const statuses = [];
    for (const [url, fields] of posts) {
        const body = new FormData();
        body.append('csrfmiddlewaretoken', token);
        for (const [name, value] of Object.entries(fields)) body.append(name, value);
        statuses.push((await fetch(url, {method: 'POST', body})).status);
    }
    return statuses;
}"""


@dataclass
class Rows:
    failed: list[OutboxMessage]
    others: list[OutboxMessage]

    @property
    def all_ids(self) -> set[int]:
        return {m.pk for m in self.failed + self.others}


@pytest.fixture(autouse=True)
def quick_password_hashing(settings):
    """Logging in through the form checks a real password: hash it cheaply here."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def rows() -> Rows:
    now = timezone.now()
    failed = [
        OutboxMessageFactory(state=OutboxState.SEND_ERROR, attempts=5, last_error=LONG_ERROR),
        OutboxMessageFactory(state=OutboxState.SEND_ERROR, attempts=5, last_error="HTTP 503"),
        OutboxMessageFactory(
            state=OutboxState.SEND_ERROR, attempts=1, last_error="connection refused"
        ),
    ]
    others = [
        OutboxMessageFactory(),
        OutboxMessageFactory(type="invoice.paid", key="invoice:9", sequence=1),
        OutboxMessageFactory(state=OutboxState.SENT, sent_at=now, finished_at=now),
    ]
    return Rows(failed, others)


def staff_user(username: str, *codenames: str) -> User:
    """A staff user (not a superuser) who may view outbox messages, plus *codenames*."""
    user = User.objects.create_user(username, password=PASSWORD, is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="django_outbox",
            codename__in=["view_outboxmessage", *codenames],
        )
    )
    return user


def log_in(page, live_server, user: User) -> None:
    """Log in through the admin's login form, landing on the outbox list."""
    changelist = reverse(CHANGELIST)
    page.goto(f"{live_server.url}{reverse('admin:login')}?next={changelist}")
    page.locator("#id_username").fill(user.username)
    page.locator("#id_password").fill(PASSWORD)
    page.locator('input[type="submit"]').click()
    expect(page).to_have_url(re.compile(re.escape(changelist) + "$"))
    # The URL changes when the navigation commits, before the page is parsed: reading
    # the list right then raced its rendering (an empty list, now and then).
    expect(page.locator("#changelist")).to_be_visible()


def listed_ids(page) -> set[int]:
    return {int(text) for text in page.locator("#result_list th.field-id a").all_inner_texts()}


def logged(message: OutboxMessage, user: User, change: str) -> bool:
    return LogEntry.objects.filter(
        object_id=str(message.pk), user=user, change_message=change
    ).exists()


def test_an_operator_filters_opens_requeues_and_cancels(live_server, new_page, rows):
    operator = staff_user(
        "operator", "change_outboxmessage", "requeue_outboxmessage", "cancel_outboxmessage"
    )
    page = new_page()
    log_in(page, live_server, operator)
    assert listed_ids(page) == rows.all_ids

    # When the operator picks "send error" in the filter sidebar,
    state_filter = page.locator('#changelist-filter details[data-filter-title="state"]')
    state_filter.get_by_role("link", name="send error", exact=True).click()
    # then only the failed messages are listed.
    expect(page).to_have_url(re.compile(r"state__exact=send_error"))
    expect(page.locator("#result_list td.field-state")).to_have_text(["send error"] * 3)
    assert listed_ids(page) == {m.pk for m in rows.failed}

    # When they open the message with the long error,
    long = rows.failed[0]
    page.locator("#result_list th.field-id").get_by_role(
        "link", name=str(long.pk), exact=True
    ).click()
    expect(page).to_have_url(re.compile(rf"/{long.pk}/change/"))
    # then the whole error is there, wrapped inside the window, its end not clipped.
    error = page.locator(".field-last_error_pretty pre")
    expect(error).to_contain_text(LAST_LINE)
    box = error.bounding_box()
    assert box is not None and box["x"] >= 0
    assert box["x"] + box["width"] <= VIEWPORT["width"], box
    drawn = error.evaluate(END_OF_TEXT_JS)
    assert drawn["hiddenWidth"] <= 0, drawn
    assert drawn["lastCharacter"]["right"] <= drawn["pre"]["right"] + 0.5, drawn
    assert drawn["pre"]["right"] <= drawn["row"]["right"] + 0.5, drawn

    # When they press Requeue on the message's page,
    requeue_button = page.locator('input[type="submit"][value="Requeue"]')
    requeue_button.click()
    # then it waits to be sent again, with fresh attempts, and the History says who did it.
    expect(page.locator(".messagelist")).to_contain_text("1 message(s) requeued.")
    expect(page.locator(".field-state .readonly")).to_have_text("should be sent")
    expect(requeue_button).to_have_count(0)
    long.refresh_from_db()
    assert (long.state, long.attempts) == (OutboxState.SHOULD_BE_SENT, 0)
    assert logged(long, operator, "Requeued through the admin.")

    # When they select another failed message in the list and run "Cancel",
    page.goto(f"{live_server.url}{reverse(CHANGELIST)}?state__exact=send_error")
    target, remaining = rows.failed[1], rows.failed[2]
    assert listed_ids(page) == {target.pk, remaining.pk}
    page.locator(f'#result_list input[name="_selected_action"][value="{target.pk}"]').check()
    page.locator('select[name="action"]').select_option("cancel_messages")
    page.locator('button[name="index"]').click()
    # then they are asked first, and asking changed nothing;
    content = page.locator("#content")
    expect(content).to_contain_text("cannot be undone")
    expect(content.locator("li")).to_have_text([str(target)])
    target.refresh_from_db()
    assert target.state == OutboxState.SEND_ERROR
    # once they confirm, the message is cancelled (finished) and logged.
    page.get_by_role("button", name="Yes, cancel them").click()
    expect(page.locator(".messagelist")).to_contain_text("1 message(s) cancelled.")
    assert listed_ids(page) == {remaining.pk}
    target.refresh_from_db()
    assert target.state == OutboxState.CANCELLED and target.finished_at is not None
    assert logged(target, operator, "Cancelled through the admin.")
    remaining.refresh_from_db()
    assert remaining.state == OutboxState.SEND_ERROR


def test_a_viewer_can_neither_requeue_nor_cancel(live_server, new_page, rows):
    viewer = staff_user("viewer")
    failed = rows.failed[0]
    page = new_page()
    log_in(page, live_server, viewer)

    # The list shows every message, with no requeue or cancel action to pick.
    assert listed_ids(page) == rows.all_ids
    for action in ("requeue_messages", "cancel_messages"):
        expect(page.locator(f'select[name="action"] option[value="{action}"]')).to_have_count(0)

    # The message's page shows the error, with no button to requeue or cancel it.
    page.goto(
        f"{live_server.url}{reverse('admin:django_outbox_outboxmessage_change', args=[failed.pk])}"
    )
    expect(page.locator(".field-last_error_pretty pre")).to_contain_text(LAST_LINE)
    expect(page.locator('input[type="submit"][value="Requeue"]')).to_have_count(0)
    expect(page.get_by_role("link", name="Cancel…")).to_have_count(0)

    # When they post the requeue and the cancel anyway, from the page and as list actions,
    own = [
        reverse(f"admin:django_outbox_outboxmessage_{verb}", args=[failed.pk])
        for verb in ("requeue", "cancel")
    ]
    as_actions = [
        {"action": action, "_selected_action": str(failed.pk), "index": "0", "confirmed": "yes"}
        for action in ("requeue_messages", "cancel_messages")
    ]
    posts = [[url, {}] for url in own] + [[reverse(CHANGELIST), fields] for fields in as_actions]
    statuses = page.evaluate(POST_JS, posts)
    # then the message's own URLs refuse (403), the list ignores actions it does not
    # offer them, and the message is as it was.
    assert statuses == [403, 403, 200, 200]
    failed.refresh_from_db()
    assert (failed.state, failed.attempts, failed.finished_at) == (OutboxState.SEND_ERROR, 5, None)
    assert not LogEntry.objects.exists()
