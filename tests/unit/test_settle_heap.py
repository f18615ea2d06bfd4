"""What a worker command does to the garbage collector before its loop (run in a child
process: a test process must not freeze its own heap)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import gc, json
import django
django.setup()
from django_outbox.engine.loop import YOUNG_COLLECTION_THRESHOLD, settle_heap
before = gc.get_threshold()
settle_heap()
print(json.dumps({
    "before": before,
    "after": gc.get_threshold(),
    "frozen": gc.get_freeze_count(),
    "young": YOUNG_COLLECTION_THRESHOLD,
}))
"""


def test_settle_heap_freezes_start_up_and_raises_only_the_young_threshold():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings", "DATABASE_URL": ""}
    run = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["frozen"] > 10_000  # Django and the app registry, out of the collector's sight
    assert seen["after"] == [seen["young"], *seen["before"][1:]]
    assert seen["young"] > seen["before"][0]
