"""The health page as an operator uses it, in a real browser against a live server.

An operator reaches the page from the admin's index, reads the chart of the last hour
(drawn on the server as SVG), sees a worker that died holding a job marked stuck, and
requeues a group of failed messages through its confirmation. Each step is checked on
the page and in the database, and a screenshot of each is saved: under
``$BROWSER_ARTEFACTS/<test name>/`` when that variable is set (CI keeps the folder),
else in the test's ``tmp_path``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from django_outbox.jobs.models import JobState
from django_outbox.outbox.models import OutboxMessage, OutboxState
from tests import health_rows as make

try:
    from playwright.sync_api import expect
except ImportError:  # the chromium fixture fails or skips the tests and says why
    expect = None

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"
#: The chart's plot area (``health.chart``): top and bottom edges, in SVG units.
PLOT_TOP, PLOT_BOTTOM = 26, 170 - 24


@pytest.fixture(autouse=True)
def quick_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def artefacts(request, tmp_path) -> Path:
    """Where this test's screenshots go."""
    root = os.environ.get("BROWSER_ARTEFACTS")
    folder = Path(root) / request.node.name if root else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def operator_user() -> User:
    user = User.objects.create_user("operator", password=PASSWORD, is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="django_outbox",
            codename__in=[
                "view_outboxmessage",
                "requeue_outboxmessage",
                "view_inboxmessage",
                "view_job",
            ],
        )
    )
    return user


def points(polyline) -> list[tuple[float, float]]:
    raw = polyline.get_attribute("points")
    return [tuple(float(n) for n in pair.split(",")) for pair in raw.split()]


def test_an_operator_reads_the_health_page_and_requeues_a_failed_group(
    live_server, new_page, artefacts
):
    # The page reads the clock seconds later, after a login: early in a minute, it
    # reads the minute the rows below were counted in.
    now = make.early_in_a_minute()
    # Given an hour of outcomes: 50 messages sent in the last minute, 20 ten minutes
    # ago, and 5 dead-lettered 30 minutes ago,
    make.counted(now, "outbox", "done", 50)
    make.counted(now, "outbox", "done", 20, minutes_ago=10)
    make.counted(now, "outbox", "dead", 5, minutes_ago=30)
    # three messages that failed alike and one that failed otherwise,
    group = [
        make.outbox(now, OutboxState.SEND_ERROR, destination="billing", last_error="HTTP 503")
        for _ in range(3)
    ]
    other = make.outbox(
        now, OutboxState.SEND_ERROR, destination="billing", last_error="connection refused"
    )
    # a live relay, and a jobs worker that died a minute ago holding a job.
    make.worker(now, "outbox")
    dead = make.worker(now, "jobs default", silent=60)
    make.job(
        now,
        JobState.RUNNING,
        claimed_by=dead.id,
        attempt_open=True,
        last_attempted_at=make.ago(now, 65),
    )
    user = operator_user()

    page = new_page()
    page.goto(f"{live_server.url}{reverse('admin:login')}?next={reverse('admin:index')}")
    page.locator("#id_username").fill(user.username)
    page.locator("#id_password").fill(PASSWORD)
    page.locator('input[type="submit"]').click()

    # When the operator follows the index's link to the health page,
    page.get_by_role("link", name="Health", exact=True).click()
    expect(page).to_have_url(
        re.compile(re.escape(reverse("admin:django_outbox_health_changelist")))
    )
    expect(page.locator("#outbox-health")).to_be_visible()
    page.screenshot(path=str(artefacts / "1-health-page.png"), full_page=True)

    # then the outbox's chart is drawn: sixty minutes per series, the busiest minute
    # at the top of the plot, an empty one on its floor, the hour's totals in the legend;
    chart = page.locator("#part-outbox svg.outbox-chart")
    expect(chart).to_be_visible()
    box = chart.bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 80, box
    done = points(chart.locator("polyline.series-done"))
    failed = points(chart.locator("polyline.series-failed"))
    assert len(done) == len(failed) == 60
    assert done[-1][1] == pytest.approx(PLOT_TOP)  # 50, the axis' top
    assert done[-11][1] == pytest.approx(PLOT_TOP + (PLOT_BOTTOM - PLOT_TOP) * 0.6)  # 20
    assert done[0][1] == pytest.approx(PLOT_BOTTOM)
    assert failed[-31][1] < PLOT_BOTTOM and failed[-1][1] == pytest.approx(PLOT_BOTTOM)
    expect(chart).to_contain_text("done: 70 in the hour")
    expect(chart).to_contain_text("failed (retried, dead-lettered, held): 5 in the hour")
    chart.screenshot(path=str(artefacts / "2-outbox-chart.png"))

    # the dead worker is shown stuck, with the job it holds;
    stuck = page.locator("#workers tr.worker-dead")
    expect(stuck).to_have_count(1)
    expect(stuck.locator(".outbox-stuck").first).to_have_text("dead: stuck")
    expect(stuck).to_contain_text("1 jobs row(s), 1 started")
    expect(stuck).to_contain_text("its worker has not beaten")
    expect(page.locator("#part-jobs .figure.held")).to_contain_text("1 stuck")
    expect(page.locator("#health-status .health-status")).to_have_text("critical")
    page.locator("#workers").screenshot(path=str(artefacts / "3-stuck-worker.png"))

    # and the failed messages are grouped by their error.
    groups = page.locator("#part-outbox tr.failure-group")
    expect(groups).to_have_count(2)
    mine = groups.filter(has_text="HTTP 503")
    expect(mine.locator("td").first).to_have_text("3")

    # When they ask to requeue the group,
    mine.get_by_role("link", name="Requeue…").click()
    # then they are asked first, and asking changed nothing;
    expect(page.locator(".group-count")).to_have_text("3")
    expect(page.locator("#health-group li")).to_have_count(3)
    page.screenshot(path=str(artefacts / "4-confirmation.png"), full_page=True)
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {OutboxState.SEND_ERROR}

    # once they confirm, the group's messages wait to be sent again, the other failed
    # one is left alone, and the history says who did it.
    page.get_by_role("button", name="Yes, requeue them").click()
    expect(page.locator(".messagelist")).to_contain_text(
        "3 outbox messages requeued (HTTP 503 at billing)."
    )
    expect(page.locator("#part-outbox tr.failure-group")).to_have_count(1)
    expect(page.locator("#part-outbox .figure.due")).to_contain_text("3")
    page.screenshot(path=str(artefacts / "5-after-requeue.png"), full_page=True)
    states = dict(OutboxMessage.objects.values_list("pk", "state"))
    assert {states[m.pk] for m in group} == {OutboxState.SHOULD_BE_SENT}
    assert states[other.pk] == OutboxState.SEND_ERROR
    entry = LogEntry.objects.get()
    assert entry.user == user and "Requeued 3 of the 3" in entry.change_message
    for name in ("1-health-page", "2-outbox-chart", "3-stuck-worker", "4-confirmation"):
        assert (artefacts / f"{name}.png").stat().st_size > 1000
