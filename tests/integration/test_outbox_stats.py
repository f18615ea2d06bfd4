"""``manage.py outbox_stats``: the health figures in text or JSON, and Nagios' exit codes
(0 ok, 1 warning, 2 critical), from ``call_command`` and from a real process."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from django_outbox.jobs.models import JobState
from django_outbox.outbox.models import OutboxState
from tests import health_rows as make
from tests.conftest import spawn_manage

pytestmark = pytest.mark.django_db


@pytest.fixture
def now():
    return make.pinned_now()


def healthy(now):
    for part in ("outbox", "inbox", "jobs"):
        make.swept(now, part, 1)
    make.worker(now, "celery")


def stats(*args):
    """Run the command; return its exit code and what it printed."""
    out = io.StringIO()
    try:
        call_command("outbox_stats", *args, stdout=out, stderr=io.StringIO())
    except SystemExit as exit:
        return exit.code, out.getvalue()
    return 0, out.getvalue()


def test_healthy_exits_0_and_prints_each_part(now):
    healthy(now)
    make.outbox(now, OutboxState.SEND_ERROR, destination="billing", last_error="HTTP 503")
    make.outbox(now, OutboxState.SENT)
    code, text = stats()
    assert code == 0
    lines = text.splitlines()
    assert lines[0] == "django-outbox OK: outbox, inbox, jobs healthy"
    assert "outbox" in lines and "inbox" in lines and "jobs" in lines
    assert "should_be_sent 0 · sending 0 · sent 1 · send_error 1 · cancelled 0" in text
    assert "1  HTTP 503 at billing" in text
    assert "[OK] oldest_due: nothing is due" in text
    assert ": alive, beat" in text


def test_a_warning_exits_1(now):
    healthy(now)
    make.job(now, available_at=make.ago(now, 120))
    code, text = stats()
    assert code == 1
    assert text.startswith(
        "django-outbox WARNING: jobs: the oldest due row has waited 120 s (1 due), warning "
        "from 60 s"
    )
    assert "[WARNING] oldest_due" in text


def test_a_critical_exits_2(now):
    healthy(now)
    dead = make.worker(now, "jobs", silent=60)
    make.job(now, JobState.RUNNING, claimed_by=dead.id, last_attempted_at=make.ago(now, 61))
    make.outbox(now, available_at=make.ago(now, 601))
    code, text = stats()
    assert code == 2
    assert text.startswith("django-outbox CRITICAL: outbox: the oldest due row has waited")
    # The dead worker's row, and what it holds, are shown.
    assert "jobs: dead, beat 60.0 s ago; holds 1 jobs row(s)" in text
    assert "1 stuck: its worker has not beaten" in text


def test_one_part_and_json(now):
    healthy(now)
    make.outbox(now, available_at=make.ago(now, 601))
    code, text = stats("--part", "jobs", "--part", "inbox", "--json")
    body = json.loads(text)
    assert code == 0
    assert body["status"] == "ok"
    assert set(body["parts"]) == {"inbox", "jobs"}
    assert {check["part"] for check in body["checks"]} == {"inbox", "jobs"}
    assert "failures" in body["parts"]["jobs"]
    code, text = stats("--part", "outbox", "--json", "--no-failures")
    body = json.loads(text)
    assert (code, body["status"]) == (2, "critical")
    assert "failures" not in body["parts"]["outbox"]


def test_an_unknown_part_is_refused():
    with pytest.raises(CommandError, match="invalid choice: 'outbx'"):
        call_command("outbox_stats", "--part", "outbx")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("waited", "code"), [(1, 0), (120, 1), (700, 2)])
def test_a_real_process_exits_as_nagios_expects(settings, waited, code):
    # The worker stays alive however long the process takes to start.
    settings.DJANGO_OUTBOX = {**settings.DJANGO_OUTBOX, "WORKER_TIMEOUT_SECONDS": 120}
    now = make.pinned_now()
    healthy(now)
    make.outbox(now, available_at=make.ago(now, waited))
    process = spawn_manage("outbox_stats", "--part", "outbox")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == code, output
    assert output.startswith(f"django-outbox {('OK', 'WARNING', 'CRITICAL')[code]}")


def test_a_database_that_cannot_be_reached_exits_3():
    from tests.conftest import subprocess_env

    env = subprocess_env(DATABASE_URL="postgres://postgres@127.0.0.1:1/nowhere")
    process = spawn_manage("outbox_stats", env=env)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 3, output
    assert output.startswith("UNKNOWN: the database could not be read:")
