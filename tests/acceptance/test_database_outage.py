"""A worker whose database goes away mid-batch, for real: ``jobs_worker``,
``outbox_relay`` and ``inbox_worker`` processes reach PostgreSQL (or MariaDB) through
a TCP proxy the test cuts for ten seconds (connections reset, new ones refused).

Nothing may stay stuck while the live process ignores it: when the database returns,
the worker writes back what its failed batch left (outcomes, releases) and every row
ends finished within seconds; while the database is away, its rows are visibly
stuck (their worker's heartbeat goes stale), not shown as normally running."""

import time
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import connection

import django_outbox
from django_outbox.engine import holding
from django_outbox.inbox.handling import Handling
from django_outbox.jobs.models import Job, JobState
from django_outbox.jobs.running import Running
from django_outbox.models import InboxMessage, InboxState, OutboxMessage, OutboxState
from django_outbox.outbox.relay import Publishing
from testproject.shop import jobs
from testproject.shop.models import Payment
from tests import conftest
from tests.acceptance.helpers import finish, kombu_ids_in_redis, read_as_it_comes, wait_for
from tests.conftest import spawn_manage, subprocess_env
from tests.proxy import TcpProxy

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.row_locks,
    pytest.mark.processes,
]

#: How long the database is away.
OUTAGE_SECONDS = 10
#: How soon after its return every row must be finished.
RECOVERY_SECONDS = 10


@pytest.fixture
def database_proxy():
    """A TCP proxy in front of the test database; yields the URL that goes through it."""
    settings = connection.settings_dict
    port = int(settings.get("PORT") or (5432 if connection.vendor == "postgresql" else 3306))
    proxy = TcpProxy(("127.0.0.1", port))
    proxy.up()
    parts = urlsplit(conftest.test_database_url())
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{proxy.port}"
    through = urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) > 1 else host))
    yield proxy, through
    proxy.down()


def start(command, through, *args, **env):
    return read_as_it_comes(
        spawn_manage(
            command,
            "--json",
            "--interval",
            "0.1",
            "--no-listen",
            *args,
            env=subprocess_env(DATABASE_URL=through, **env),
        )
    )


def shown_as_stuck(part):
    """The held rows of *part* that the admin marks as stuck (``engine.holding``, the
    rule its list and its "stuck" filter use), and all its held rows."""
    model = part.model._default_manager
    stuck = set(model.filter(holding.stuck(part)).values_list("pk", flat=True))
    held = set(model.filter(holding.held(part)).values_list("pk", flat=True))
    return stuck, held


def cut(proxy, during):
    """Cut the database for ``OUTAGE_SECONDS``; call *during* once half of it has passed.
    Returns when the database is back (``time.monotonic()``)."""
    proxy.down()
    time.sleep(OUTAGE_SECONDS / 2)
    during()
    time.sleep(OUTAGE_SECONDS / 2)
    proxy.up()
    return time.monotonic()


@pytest.mark.jobs
def test_a_jobs_worker_cut_off_its_database_mid_batch_finishes_every_job_once_it_returns(
    database_proxy,
):
    proxy, through = database_proxy
    results = [jobs.slow.enqueue(f"cut-{n}", 0.05) for n in range(80)]
    worker = start("jobs_worker", through)
    try:
        wait_for(
            lambda: Job.objects.filter(state=JobState.SUCCESSFUL).count() >= 5,
            timeout=60,
            what="the worker to be mid-batch",
        )
        assert Job.objects.filter(state=JobState.RUNNING).exists()

        def while_cut():
            # Its jobs are RUNNING under a worker whose heartbeat is stale: the admin
            # shows every one of them as stuck, not as running.
            stuck, held = shown_as_stuck(Running())
            assert held and stuck == held

        back = cut(proxy, while_cut)
        wait_for(
            lambda: Job.objects.filter(state=JobState.SUCCESSFUL).count() == len(results),
            timeout=60,
            what="every job to succeed after the database came back",
        )
        took = time.monotonic() - back
    finally:
        output = finish(worker)
    assert not Job.objects.exclude(state=JobState.SUCCESSFUL).exists()
    assert took < RECOVERY_SECONDS, f"every job finished {took:.1f}s after the return\n{output}"
    # Every job did its work (a job whose database write failed in the outage ran again).
    refs = set(Payment.objects.values_list("order_ref", flat=True))
    assert refs == {f"cut-{n}" for n in range(80)}
    assert worker.returncode == 0, output
    # One episode, said once or twice per component, and its end: not a line per retry.
    # (A job whose own query failed in the outage says so once, as any failed attempt.)
    said = [
        line
        for line in output.splitlines()
        if (" WARNING " in line or " ERROR " in line) and "failed, will retry" not in line
    ]
    assert len(said) <= 6, "\n".join(said)
    assert any("works again after" in line for line in said), output


@pytest.mark.redis
def test_a_relay_cut_off_its_database_after_publishing_records_the_batch_once_it_returns(
    configure_outbox, database_proxy, redis_url, queue_name, tmp_path
):
    proxy, through = database_proxy
    configure_outbox(
        DESTINATIONS={"orders": {"TRANSPORT": "kombu", "URL": redis_url, "QUEUE": queue_name}}
    )
    sent = [django_outbox.send("order.created", {"n": n}, to="orders") for n in range(50)]
    marker = tmp_path / "published"
    relay = start(
        "outbox_relay", through, TESTPROJECT_PAUSE_AFTER_PUBLISH=f"{marker}:{OUTAGE_SECONDS / 2}"
    )
    try:
        wait_for(marker.exists, timeout=60, what="the relay to publish its first batch")

        def while_cut():
            stuck, held = shown_as_stuck(Publishing())
            assert held and stuck == held

        back = cut(proxy, while_cut)
        wait_for(
            lambda: OutboxMessage.objects.filter(state=OutboxState.SENT).count() == len(sent),
            timeout=60,
            what="every message to be recorded as sent",
        )
        took = time.monotonic() - back
    finally:
        output = finish(relay)
    assert took < RECOVERY_SECONDS, f"recorded {took:.1f}s after the return\n{output}"
    # The published batch was recorded, not published again after the outage.
    published = kombu_ids_in_redis(redis_url, queue_name)
    assert sorted(published) == sorted(str(m.message_id) for m in sent)


def test_an_inbox_worker_cut_off_its_database_mid_batch_handles_every_message_once(
    configure_outbox, database_proxy
):
    proxy, through = database_proxy
    configure_outbox(INBOX={"SOURCES": {"billing": {"TRANSPORT": "local"}}})
    for n in range(60):
        django_outbox.receive(
            "invoice.requested", {"order_id": n}, source="billing", message_id=f"m-{n}"
        )
    worker = start("inbox_worker", through, "--batch", "20", TESTPROJECT_HANDLER_DELAY="0.05")
    try:
        wait_for(
            lambda: InboxMessage.objects.filter(state=InboxState.HANDLED).count() >= 20,
            timeout=60,
            what="the worker to be mid-batch",
        )

        def while_cut():
            stuck, held = shown_as_stuck(Handling())
            assert stuck == held

        back = cut(proxy, while_cut)
        wait_for(
            lambda: InboxMessage.objects.filter(state=InboxState.HANDLED).count() == 60,
            timeout=60,
            what="every message to be handled after the database came back",
        )
        took = time.monotonic() - back
    finally:
        output = finish(worker)
    assert took < RECOVERY_SECONDS, f"handled {took:.1f}s after the return\n{output}"
    # Effects in the handler's transaction: exactly once, the outage notwithstanding.
    refs = sorted(Payment.objects.values_list("order_ref", flat=True))
    assert refs == sorted(str(n) for n in range(60))
