"""``outbox_partition convert`` on tables that hold rows, in a database of its own,
through the real command: nothing is copied or lost, what was stored before is still
a duplicate after, ids go on, and the engine carries on over the first partition."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.postgres, pytest.mark.one_database]

BEFORE = """
import json
import django_outbox
from django_outbox.models import OutboxMessage
from django_outbox.outbox.relay import Relay
from testproject.shop import jobs
for n in range(30):
    django_outbox.send("t", {"n": n}, to="default", key=f"k{n % 3}")
    django_outbox.receive("t", {"n": n}, source="s", message_id=f"m{n}")
jobs.sync_customer.enqueue(customer="c-1")
Relay(batch_size=10).run_batch()
print(json.dumps({
    "sent": OutboxMessage.objects.filter(state="sent").count(),
    "max_id": OutboxMessage.objects.order_by("-id").values_list("id", flat=True)[0],
}))
"""

AFTER = """
import json
import django_outbox
from django_outbox.engine import partitions
from django_outbox.models import InboxMessage, Job, OutboxMessage
from django_outbox.outbox.relay import Relay
from testproject.shop import jobs
duplicate = django_outbox.receive("t", {}, source="s", message_id="m7")
fresh = django_outbox.receive("t", {}, source="s", message_id="m-new")
new = django_outbox.send("t", {}, to="default", key="k1")
again = jobs.sync_customer.enqueue(customer="c-1")
while Relay(batch_size=10).run_batch().claimed:
    pass
print(json.dumps({
    "partitioned": [
        partitions.is_partitioned(model, "default") for model in (OutboxMessage, InboxMessage, Job)
    ],
    "duplicate": duplicate[1], "fresh": fresh[1],
    "inbox": InboxMessage.objects.count(),
    "new_id": new.pk,
    "new_partition": partitions.partitions(OutboxMessage, "default")[0].name,
    "unsent": OutboxMessage.objects.exclude(state="sent").count(),
    "outbox": OutboxMessage.objects.count(),
    "jobs": Job.objects.count(),
    "same_job": str(Job.objects.get(unique_key="sync-c-1").result_id) == again.id,
}))
"""


def manage(env, *args):
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_converting_tables_with_rows_keeps_them_and_the_engine_goes_on():
    import psycopg

    name = f"outbox_conversion_{uuid.uuid4().hex[:8]}"
    admin = "postgresql://postgres@127.0.0.1:5432/postgres"
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{name}",
        "OUTBOX_SETTINGS_JSON": json.dumps(
            {"OUTBOX": {"DESTINATIONS": {"default": {"TRANSPORT": "memory"}}}, "DISPATCH": "none"}
        ),
    }
    try:
        manage(env, "migrate", "-v0")
        before = json.loads(manage(env, "shell", "-c", BEFORE).strip().splitlines()[-1])
        assert before["sent"] == 10

        said = manage(env, "outbox_partition", "convert", "--ahead", "2")
        assert "outbox: django_outbox_message is partitioned by day; its 30 row(s)" in said
        assert "30 message id(s) remembered" in said
        assert "jobs: django_outbox_job is partitioned by day; its 1 row(s)" in said
        assert "partitioned already" in manage(env, "outbox_partition", "convert", "outbox")
        status = manage(env, "outbox_partition", "status", "inbox")
        assert "django_outbox_inbox_legacy: MINVALUE .." in status
        assert "django_outbox_inbox_default: DEFAULT" in status

        after = json.loads(manage(env, "shell", "-c", AFTER).strip().splitlines()[-1])
        assert after["partitioned"] == [True, True, True]
        # Stored before the conversion: still a duplicate after it.
        assert (after["duplicate"], after["fresh"]) == (False, True)
        assert after["inbox"] == 31
        assert after["new_id"] > before["max_id"]
        assert after["new_partition"] == "django_outbox_message_legacy"
        assert (after["outbox"], after["unsent"]) == (31, 0)
        assert (after["jobs"], after["same_job"]) == (1, True)
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_conversion_killed_between_its_two_steps_is_run_again_to_the_end(tmp_path):
    """Killed by SIGKILL after step 1 (the indexes built, the cut-over constraint added
    and checked): the table is still whole and unpartitioned, and the same command run
    again (whose cut-over may differ) finishes the conversion."""
    import signal

    import psycopg

    name = f"outbox_conversion_{uuid.uuid4().hex[:8]}"
    admin = "postgresql://postgres@127.0.0.1:5432/postgres"
    url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    env = {
        **os.environ,
        "DATABASE_URL": url.replace("postgresql:", "postgres:"),
        "OUTBOX_SETTINGS_JSON": json.dumps(
            {"OUTBOX": {"DESTINATIONS": {"default": {"TRANSPORT": "memory"}}}, "DISPATCH": "none"}
        ),
    }
    marker = tmp_path / "killed"
    try:
        manage(env, "migrate", "-v0")
        manage(env, "shell", "-c", "import django_outbox\n" + SEND_FIVE)
        armed = {
            **env,
            "DJANGO_OUTBOX_KILL_AT": "partitions.before_swap",
            "DJANGO_OUTBOX_KILL_MARKER": str(marker),
        }
        killed = subprocess.run(
            [sys.executable, "manage.py", "outbox_partition", "convert", "outbox"],
            cwd=ROOT,
            env=armed,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert marker.read_text().startswith("partitions.before_swap")
        with psycopg.connect(url) as connection:
            left = connection.execute(
                "SELECT conname FROM pg_constraint "
                "WHERE conrelid = 'django_outbox_message'::regclass AND contype = 'c' "
                "AND conname LIKE '%before_cutover'"
            ).fetchall()
            kind = connection.execute(
                "SELECT relkind FROM pg_class WHERE relname = 'django_outbox_message'"
            ).fetchone()
        assert len(left) == 1 and kind == ("r",)  # step 1 done, no swap

        said = manage(env, "outbox_partition", "convert", "outbox")
        assert "django_outbox_message is partitioned by day; its 5 row(s)" in said
        with psycopg.connect(url) as connection:
            rows = connection.execute("SELECT count(*) FROM django_outbox_message").fetchone()
            # The legacy partition keeps its checked bound (the attach needed no scan).
            left = connection.execute(
                "SELECT conrelid::regclass::text FROM pg_constraint "
                "WHERE conname LIKE '%before_cutover'"
            ).fetchall()
        assert rows == (5,) and left == [("django_outbox_message_legacy",)]
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


SEND_FIVE = """
for n in range(5):
    django_outbox.send("t", {"n": n}, to="default")
"""
