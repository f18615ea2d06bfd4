"""The kill-point hook itself: armed only by its environment variable, at the N-th
reach of the named point, and loud about it (W022); a typo fails at import."""

import os
import signal
import subprocess
import sys

import pytest

from django_outbox.checks import check_kill_points
from django_outbox.engine import faults


def run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """*code* in a fresh interpreter (the hook is armed at import), with *env*."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_OUTBOX_KILL")}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", f"from django_outbox.engine import faults\n{code}"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_unarmed_points_do_nothing():
    assert faults.armed() is None
    for name in faults.POINTS:
        faults.point(name)  # still here


def test_the_armed_point_kills_at_its_nth_reach_and_writes_the_marker(tmp_path):
    marker = tmp_path / "marker"
    code = "for n in range(5):\n    faults.point('jobs.before_record')\n    print(n, flush=True)\n"
    code = "faults.point('jobs.in_job')\n" + code  # another point: passed over
    died = run(
        code, DJANGO_OUTBOX_KILL_AT="jobs.before_record@3", DJANGO_OUTBOX_KILL_MARKER=str(marker)
    )
    assert died.returncode == -signal.SIGKILL
    assert died.stdout.split() == ["0", "1"]
    assert marker.read_text().split()[0] == "jobs.before_record@3"
    assert run(code, DJANGO_OUTBOX_KILL_AT="jobs.before_record").stdout == ""  # @1 by default


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("jobs.in_jobs", "unknown kill point 'jobs.in_jobs'; the kill points are outbox."),
        ("jobs.in_job@0", "must be a whole number >= 1"),
        ("jobs.in_job@x", "must be a whole number >= 1"),
    ],
)
def test_a_bad_value_fails_at_import(value, error):
    failed = run("", DJANGO_OUTBOX_KILL_AT=value)
    assert failed.returncode == 1
    assert error in failed.stderr


def test_the_system_check_warns_while_armed(monkeypatch):
    assert check_kill_points() == []
    monkeypatch.setattr(faults, "_armed", ("inbox.before_ack", 2))
    (warning,) = check_kill_points()
    assert warning.id == "django_outbox.W022"
    assert "inbox.before_ack@2" in warning.msg
    assert "KILLS ITSELF" in warning.msg
