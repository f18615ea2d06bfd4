"""The sweep leaves a mark; workers and the admin say so when it stops."""

import logging
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

import django_outbox
from django_outbox.engine.heartbeat import Heartbeat
from django_outbox.engine.models import SweepMark
from django_outbox.engine.sweeps import stale_sweeps
from django_outbox.outbox.maintenance import sweep
from django_outbox.outbox.relay import Relay

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:django_outbox_outboxmessage_changelist"


def test_a_sweep_stamps_its_mark_with_the_database_clock():
    before = timezone.now() - timedelta(seconds=1)  # the database runs on this host
    sweep()
    mark = SweepMark.objects.get(part="outbox")
    assert mark.last_run_at >= before
    assert ":" in mark.ran_by
    sweep()
    assert SweepMark.objects.get(part="outbox").last_run_at >= mark.last_run_at


def test_nothing_is_stale_while_nothing_waits():
    assert stale_sweeps() == []


def test_waiting_rows_without_any_sweep_are_reported():
    django_outbox.send("t", {})
    [found] = stale_sweeps()
    assert (found.part, found.last_run_at, found.silent_for) == ("outbox", None, None)
    assert "no sweep has ever run" in found.describe()


def test_an_old_mark_is_stale_and_a_fresh_one_is_not(configure_outbox):
    configure_outbox(SWEEP_STALE_SECONDS=60)
    django_outbox.send("t", {})
    SweepMark.objects.create(
        part="outbox", last_run_at=timezone.now() - timedelta(seconds=90), ran_by="h:1"
    )
    [found] = stale_sweeps()
    assert 89 <= found.silent_for < 120
    assert "its last sweep ran 9" in found.describe()
    SweepMark.objects.filter(part="outbox").update(last_run_at=timezone.now())
    assert stale_sweeps() == []


def test_a_worker_warns_once_per_episode_and_says_when_sweeps_are_back(caplog):
    django_outbox.send("t", {})
    worker = Heartbeat("test")
    with caplog.at_level(logging.INFO, logger="django_outbox.heartbeat"):
        worker.check_sweeps(force=True)
        worker.check_sweeps(force=True)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert "outbox has unfinished rows and no sweep has ever run" in warnings[0].message
        caplog.clear()
        # A relay sends the row meanwhile, but nothing sweeps: nothing waits, no warning.
        Relay().drain()
        worker.check_sweeps(force=True)
        assert [r.message for r in caplog.records] == [
            "outbox: sweeps run again (or nothing waits for one)"
        ]


def test_the_admin_list_warns_when_sweeps_stopped(client):
    client.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
    django_outbox.send("t", {})
    response = client.get(reverse(CHANGELIST))
    assert "no sweep has ever run" in response.text
    sweep()
    django_outbox.send("t", {})
    response = client.get(reverse(CHANGELIST))
    assert "sweep" not in " ".join(str(m) for m in response.context["messages"])


def test_the_warning_of_each_part_names_what_runs_its_sweep(configure_outbox):
    """An operator told "no sweep" learns what to start for that part: the inbox's own
    worker and sweep, the jobs' own, not the outbox's."""
    from django_outbox.engine.sweeps import StaleSweep

    said = {
        part: StaleSweep(part=part, last_run_at=None, silent_for=None).describe()
        for part in ("outbox", "inbox", "jobs")
    }
    assert "sweep_outbox" in said["outbox"] and "outbox_relay" in said["outbox"]
    assert "sweep_inbox" in said["inbox"] and "inbox_worker" in said["inbox"]
    assert "inbox_sweep" in said["inbox"] and "outbox_" not in said["inbox"]
    assert "sweep_jobs" in said["jobs"] and "jobs_worker" in said["jobs"]
    assert "jobs_sweep" in said["jobs"] and "outbox_" not in said["jobs"]
