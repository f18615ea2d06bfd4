"""Celery beat stops: the Celery worker says so in its log within seconds, and says
when beat is back. Real beat and worker processes, beat killed with SIGKILL."""

import signal
import subprocess
import sys

import pytest

import django_outbox
from django_outbox.engine.models import SweepMark
from django_outbox.models import OutboxMessage, OutboxState
from tests.acceptance.helpers import stop, wait_for
from tests.conftest import ROOT, subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def celery(*args, log):
    env = subprocess_env(TESTPROJECT_SWEEP_SECONDS="0.5", OUTBOX_LOG_LEVEL="INFO")
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "testproject", *args],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_the_worker_warns_when_beat_stops_and_when_it_is_back(configure_outbox, tmp_path):
    configure_outbox(DISPATCH="none", SWEEP_STALE_SECONDS=2)
    log_path = tmp_path / "worker.log"
    schedule = str(tmp_path / "beat-schedule")
    processes = []
    with open(log_path, "w") as log:
        worker = celery(
            *("worker", "--pool=solo", "-Q", "celery", "-l", "INFO"),
            *("--without-heartbeat", "--without-gossip", "--without-mingle"),
            log=log,
        )
        processes.append(worker)
        beat = celery("beat", "-s", schedule, "-l", "WARNING", log=subprocess.DEVNULL)
        processes.append(beat)
        try:
            # With no trigger at all (DISPATCH none), beat's sweeps deliver the row.
            message = django_outbox.send("t", {})
            wait_for(
                lambda: OutboxMessage.objects.get(pk=message.pk).state == OutboxState.SENT,
                timeout=60,
                what="the beat sweep to deliver the row",
            )
            # (A trigger another test left in the shared queue may have delivered it
            # first: the sweeps' own mark is what this test needs.)
            wait_for(
                lambda: SweepMark.objects.filter(part="outbox").exists(),
                timeout=10,
                what="beat's outbox sweep to stamp its mark",
            )

            # Beat starting up slower than SWEEP_STALE_SECONDS (a loaded machine) is an
            # episode of its own, warned about and ended before this point: count the
            # warnings of the episode the kill starts, from here on.
            killed_at = len(log_path.read_text())
            beat.send_signal(signal.SIGKILL)
            beat.wait(timeout=10)
            django_outbox.send("t", {})  # a row that waits for a sweep that never comes
            wait_for(
                lambda: "outbox has unfinished rows and its last sweep ran" in log_path.read_text(),
                timeout=30,
                what="the worker's warning that no sweep runs",
            )
            assert OutboxMessage.objects.filter(state=OutboxState.SHOULD_BE_SENT).count() == 1

            beat = celery("beat", "-s", schedule, "-l", "WARNING", log=subprocess.DEVNULL)
            processes.append(beat)
            wait_for(
                lambda: "outbox: sweeps run again" in log_path.read_text(),
                timeout=30,
                what="the worker to say sweeps are back",
            )
            # The mark is stamped by the rescue sweep; the row goes out with the next
            # due-rows sweep, which beat runs on its own schedule.
            wait_for(
                lambda: not OutboxMessage.objects.filter(state=OutboxState.SHOULD_BE_SENT).exists(),
                timeout=30,
                what="beat's sweeps, back, to deliver the waiting row",
            )
        finally:
            for process in processes:
                if process.poll() is None:
                    stop(process)
    # Once per episode (counted in the lines of Django's log handler).
    after_kill = log_path.read_text()[killed_at:]
    assert after_kill.count("WARNING django_outbox.heartbeat: outbox has unfinished") == 1
