"""The JSON health probe (``django_outbox.health.views``): nothing for anonymous callers,
a bearer token or a staff session, then 200 while healthy or warning, 503 when
critical."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from django_outbox.jobs.models import JobState
from tests import health_rows as make

pytestmark = pytest.mark.django_db

TOKEN = "kz4GqP1t-6xS0cW9vYbN2mRj7LdHa3Ue"


@pytest.fixture
def probe():
    return reverse("django_outbox_health:health")


@pytest.fixture
def now():
    return make.pinned_now()


@pytest.fixture
def with_token(settings):
    settings.DJANGO_OUTBOX = {**settings.DJANGO_OUTBOX, "HEALTH": {"TOKEN": TOKEN}}


def bearer(token=TOKEN):
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def healthy(now):
    for part in ("outbox", "inbox", "jobs"):
        make.swept(now, part, 1)
    make.worker(now, "celery")


@pytest.mark.parametrize(
    ("headers", "code", "detail"),
    [
        ({}, 401, "credentials required: a bearer token or a staff session"),
        (bearer("not-the-token"), 403, "wrong token"),
        (bearer(""), 403, "wrong token"),
        ({"HTTP_AUTHORIZATION": f"Basic {TOKEN}"}, 403, "this probe takes no such credentials"),
    ],
)
def test_a_caller_without_the_token_learns_nothing(
    client, probe, with_token, headers, code, detail
):
    response = client.get(probe, **headers)
    assert response.status_code == code
    assert response.json() == {"detail": detail}
    if code == 401:
        assert response["WWW-Authenticate"].startswith("Bearer")


def test_without_a_token_setting_no_token_is_accepted(client, probe):
    response = client.get(probe, **bearer(""))
    assert response.status_code == 403
    assert response.json() == {"detail": "this probe takes no such credentials"}


def test_a_user_who_is_not_staff_is_refused(client, probe):
    client.force_login(User.objects.create_user("visitor"))
    response = client.get(probe)
    assert response.status_code == 403
    assert response.json() == {"detail": "staff only"}


def test_the_token_reads_a_healthy_service(client, probe, with_token, now):
    healthy(now)
    response = client.get(probe, **bearer())
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert {check["status"] for check in body["checks"]} == {"ok"}
    assert len(body["checks"]) == 12  # four checks for each of three parts
    assert set(body["parts"]) == {"outbox", "inbox", "jobs"}
    assert "failures" not in body["parts"]["outbox"]  # the page's, not the probe's
    assert "no-cache" in response["Cache-Control"]


def test_a_staff_session_reads_it_too(client, probe, now):
    healthy(now)
    client.force_login(User.objects.create_user("operator", is_staff=True))
    response = client.get(probe)
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_a_warning_still_answers_200(client, probe, with_token, now):
    healthy(now)
    make.outbox(now, available_at=make.ago(now, 90))  # over the 60 s warning
    response = client.get(probe, **bearer())
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "warning"
    (bad,) = [check for check in body["checks"] if check["status"] != "ok"]
    assert (bad["part"], bad["check"]) == ("outbox", "oldest_due")
    assert bad["value"] == pytest.approx(90, abs=1)


def test_a_critical_check_answers_503(client, probe, with_token, now):
    healthy(now)
    dead = make.worker(now, "jobs", silent=60)
    make.job(now, JobState.RUNNING, claimed_by=dead.id)
    make.job(now, available_at=make.ago(now, 700))  # over the 600 s critical
    response = client.get(probe, **bearer())
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "critical"
    bad = {(c["part"], c["check"]): c["status"] for c in body["checks"] if c["status"] != "ok"}
    # The Celery worker takes jobs too: the dead one's job waits for its rescue.
    assert bad == {("jobs", "oldest_due"): "critical", ("jobs", "workers"): "warning"}


def test_some_parts_only(client, probe, with_token, now):
    healthy(now)
    make.outbox(now, available_at=make.ago(now, 700))
    response = client.get(probe + "?part=jobs&part=inbox", **bearer())
    assert response.status_code == 200
    assert {check["part"] for check in response.json()["checks"]} == {"jobs", "inbox"}
    response = client.get(probe + "?part=outbx", **bearer())
    assert response.status_code == 400
    assert response.json() == {"detail": "unknown part(s): outbx"}


def test_only_get_and_head(client, probe, with_token):
    assert client.post(probe, **bearer()).status_code == 405
    assert client.head(probe, **bearer()).status_code in (200, 503)


def test_a_database_that_cannot_be_read_is_critical(client, probe, with_token, monkeypatch):
    from django.db import OperationalError

    def unreachable(*args, **kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr("django_outbox.health.figures.read", unreachable)
    response = client.get(probe, **bearer())
    assert response.status_code == 503
    assert response.json() == {"status": "critical", "error": "the database could not be read"}
