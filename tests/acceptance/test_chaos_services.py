"""Two services and their jobs under faults, reduced (issue 16, section 2): the chaos
harness (``python -m tests.chaos``) run at a size CI affords.

Every kind of process SIGKILLed at least once, the three hosts (a relay's, a
consumer's, a job worker's) cut off for 10-12 s, Redis and RabbitMQ restarted, the
databases' connections terminated, PostgreSQL restarted once, B's webhook slow and then
answering 503 for a while, sent messages published again; then 0 lost, every
effect once, keys in order, jobs run, no expired lease left claimed.
``make chaos-services`` runs it at full size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import hosts, services
from tests.conftest import ROOT

pytestmark = [
    pytest.mark.processes,
    pytest.mark.postgres,
    pytest.mark.rabbitmq,
    pytest.mark.redis,
    pytest.mark.netns,
    pytest.mark.jobs,
    pytest.mark.restarts_services,
]

REDUCED = [
    *("--messages", os.environ.get("CHAOS_SERVICES_MESSAGES", "600")),
    *("--jobs", os.environ.get("CHAOS_SERVICES_JOBS", "150")),
    *("--kills", "12", "--cuts", "3", "--cut-min", "10", "--cut-max", "12"),
    *("--seconds", "50", "--duplicates", "30", "--pg-terminations", "2"),
    *("--drain-timeout", "60", "--seed", os.environ.get("CHAOS_SEED", "16")),
    *("--max-takeover", "10"),
]


def test_two_services_and_their_jobs_survive_every_fault(tmp_path):
    reason = hosts.available()
    if reason is not None:
        if services.services_required():
            pytest.fail(f"CI must run the chaos harness: {reason}")
        pytest.skip(reason)
    for name in ("postgres", "redis", "rabbitmq"):
        services.require(name)
    report_file = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "tests.chaos", *REDUCED, "--report", str(report_file)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    summary = "\n".join(line for line in done.stdout.splitlines() if not line.startswith(" "))
    print(f"\n{summary}")
    assert report_file.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(report_file.read_text())
    assert report["failures"] == [], summary
    assert done.returncode == 0, summary
    messages, faults = report["messages"], report["faults"]
    # The faults happened: every kind of process killed, the cuts, both restarts.
    assert set(faults["kills by kind"]) >= {
        *("producer", "relay-a", "consume-a", "jobs-a", "consume-b"),
        *("web-b", "inbox-worker-b", "relay-b", "jobs-b"),
    }, faults
    assert len(faults["cuts"]) == 3 and not faults["errors"], faults
    assert {r["service"] for r in faults["restarts"]} == {"redis", "rabbitmq", "postgres"}, faults
    assert {w["kind"] for w in faults["webhook"]} == {"slow", "unavailable"}, faults
    assert len(report["takeover"]) == 3, report["takeover"]
    assert report["duplicates"]["suppressed (one row, one effect each)"] > 0, report["duplicates"]
    # What the harness checked, spelled out.
    assert messages["intents"] == 600 and messages["lost"] == 0
    assert messages["duplicated_effects"] == 0 and messages["not_handled"] == 0
    assert report["jobs A"]["never_ran"] == 0 and report["jobs B"]["never_ran"] == 0
    assert report["drained (s)"] is not None
