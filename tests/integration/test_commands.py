"""Management commands, driven with call_command."""

import io
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

import django_outbox
from django_outbox.models import InboxMessage, InboxState, OutboxMessage, OutboxState
from django_outbox.outbox.maintenance import purge_finished_messages
from django_outbox.outbox.transports.memory import mailbox
from tests.factories import OutboxMessageFactory, leave_sending

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args):
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_outbox_relay_until_empty_delivers_everything():
    for n in range(25):
        django_outbox.send("t", {"n": n})
    out = run("outbox_relay", "--json", "--until-empty", "--batch", "10", "--interval", "0")
    assert json.loads(out.strip().splitlines()[-1])["sent"] == 25
    assert len(mailbox["default"]) == 25


def test_no_prefetch_drains_on_one_thread(monkeypatch):
    from django.db import connection

    from django_outbox.engine.runner import Runner

    prefetching = []
    drain_prefetching = Runner._drain_prefetching

    def spy(self, *args, **kwargs):
        prefetching.append(self)
        return drain_prefetching(self, *args, **kwargs)

    monkeypatch.setattr(Runner, "_drain_prefetching", spy)
    for n in range(25):
        django_outbox.send("t", {"n": n})
    out = run(
        "outbox_relay",
        "--json",
        "--until-empty",
        "--batch",
        "10",
        "--interval",
        "0",
        "--no-prefetch",
    )
    assert json.loads(out.strip().splitlines()[-1])["sent"] == 25
    assert prefetching == []
    # The same drain without the option claims ahead where the database allows it.
    for n in range(25):
        django_outbox.send("t", {"n": n})
    out = run("outbox_relay", "--json", "--until-empty", "--batch", "10", "--interval", "0")
    assert json.loads(out.strip().splitlines()[-1])["sent"] == 25
    assert len(prefetching) == int(connection.features.has_select_for_update_skip_locked)


@pytest.mark.parametrize(("given", "expected"), [([], 2), (["--unconfirmed-batches", "0"], 0)])
def test_unconfirmed_batches_sets_how_many_batches_the_relay_keeps_waiting(
    monkeypatch, given, expected
):
    from django_outbox.engine.runner import Runner

    drains = []
    drain = Runner.drain

    def spy(self, *args, **kwargs):
        drains.append(self.waiting_batches)
        return drain(self, *args, **kwargs)

    monkeypatch.setattr(Runner, "drain", spy)
    django_outbox.send("t", {})
    run("outbox_relay", "--until-empty", "--interval", "0", *given)
    assert drains and set(drains) == {expected}


def test_outbox_relay_max_batches_stops_early():
    for n in range(25):
        django_outbox.send("t", {"n": n})
    run("outbox_relay", "--max-batches", "1", "--batch", "10", "--interval", "0")
    assert OutboxMessage.objects.filter(state=OutboxState.SENT).count() == 10


@pytest.mark.parametrize(
    "bad",
    [
        ["--batch", "0"],
        ["--interval", "-1"],
        ["--batch", "x"],
        ["--unconfirmed-batches", "-1"],
        ["--unconfirmed-batches", "two"],
    ],
)
def test_outbox_relay_rejects_bad_arguments(bad):
    with pytest.raises(CommandError):
        call_command("outbox_relay", *bad)


def test_outbox_sweep_rescues_and_delivers():
    message = django_outbox.send("t", {})
    leave_sending(message, lease_ends_in=-5)
    counts = json.loads(run("outbox_sweep"))
    assert (counts["resent"], counts["sent"]) == (1, 1)


@pytest.mark.plain_retention
def test_purge_deletes_only_finished_rows_past_retention_in_batches():
    old = timezone.now() - timedelta(days=30)
    for state in (OutboxState.SENT, OutboxState.CANCELLED):
        OutboxMessageFactory.create_batch(7, state=state, sent_at=old, finished_at=old)
    recent = OutboxMessageFactory(
        state=OutboxState.SENT, sent_at=timezone.now(), finished_at=timezone.now()
    )
    failed = OutboxMessageFactory(state=OutboxState.SEND_ERROR, created_at=old)
    pending = OutboxMessageFactory(created_at=old)
    assert purge_finished_messages(batch_size=4) == 14
    assert set(OutboxMessage.objects.values_list("pk", flat=True)) == {
        recent.pk,
        failed.pk,
        pending.pk,
    }
    assert "purged 1 message(s)" in run("outbox_purge", "--older-than-days", "0")


def test_requeue_by_destination_with_dry_run_and_progress():
    OutboxMessageFactory.create_batch(5, state=OutboxState.SEND_ERROR, destination="held")
    OutboxMessageFactory.create_batch(2, state=OutboxState.SEND_ERROR, destination="default")
    out = run("outbox_requeue", "--destination", "held", "--dry-run")
    assert "5 message(s) would be requeued" in out
    assert OutboxMessage.objects.filter(state=OutboxState.SEND_ERROR).count() == 7
    out = run("outbox_requeue", "--destination", "held", "--batch", "2")
    assert "requeued 4/5" in out
    assert "requeued 5 message(s)" in out
    assert OutboxMessage.objects.filter(state=OutboxState.SEND_ERROR).count() == 2


def test_requeue_by_id_and_uuid():
    a, b, c = OutboxMessageFactory.create_batch(3, state=OutboxState.SEND_ERROR, attempts=9)
    run("outbox_requeue", "--id", str(a.pk), "--id", str(b.message_id))
    states = dict(OutboxMessage.objects.values_list("pk", "state"))
    assert states == {
        a.pk: OutboxState.SHOULD_BE_SENT,
        b.pk: OutboxState.SHOULD_BE_SENT,
        c.pk: OutboxState.SEND_ERROR,
    }
    assert OutboxMessage.objects.get(pk=a.pk).attempts == 0


def test_a_requeued_batch_triggers_the_relay_when_it_commits(configure_outbox, monkeypatch):
    """Each batch the command moves is committed and triggers the relay: the messages go
    out now, not at the next sweep."""
    from django_outbox.engine import triggers

    configure_outbox(DISPATCH="celery", DISPATCH_IN_BACKGROUND=False)
    sent = []
    monkeypatch.setattr(
        triggers, "_send_celery", lambda part, using, ids: sent.append((part, list(ids)))
    )
    OutboxMessageFactory.create_batch(3, state=OutboxState.SEND_ERROR)
    run("outbox_requeue", "--state", "send_error", "--batch", "2")
    assert sent == [("outbox", []), ("outbox", [])]


def test_requeue_requires_a_filter_and_valid_ids():
    with pytest.raises(CommandError, match="at least one"):
        call_command("outbox_requeue")
    with pytest.raises(CommandError):
        call_command("outbox_requeue", "--id", "not-an-id")


# The workers' survival of a real database outage (a proxy cut for ten seconds under
# outbox_relay, inbox_worker and jobs_worker processes) is in
# tests/acceptance/test_database_outage.py.


def test_inbox_worker_until_empty_handles_what_is_due(configure_outbox):
    configure_outbox(INBOX={"SOURCES": {"shop": {"TRANSPORT": "local"}}})
    for n in range(12):
        django_outbox.receive(
            "payment.captured", {"order": f"w-{n}"}, source="shop", message_id=f"w-{n}"
        )
    out = run("inbox_worker", "--json", "--until-empty", "--batch", "5", "--interval", "0")
    assert json.loads(out.strip().splitlines()[-1])["done"] == 12
    assert InboxMessage.objects.filter(state=InboxState.HANDLED).count() == 12


def test_inbox_sweep_gives_back_a_dead_worker_s_claims_and_handles_what_is_due(
    configure_outbox,
):
    import uuid

    from django_outbox.engine.models import Worker

    configure_outbox(INBOX={"SOURCES": {"shop": {"TRANSPORT": "local"}}})
    message, _ = django_outbox.receive(
        "payment.captured", {"order": "claimed"}, source="shop", message_id="claimed"
    )
    now = timezone.now()
    dead = Worker.objects.create(
        id=uuid.uuid4(), name="dead", heartbeat_at=now - timedelta(seconds=60)
    )
    Worker.objects.create(
        id=uuid.uuid4(), name="live", heartbeat_at=now, healthy_since=now - timedelta(seconds=60)
    )
    # Claimed (lease for a minute) by a worker that died in the handler's transaction.
    InboxMessage.objects.filter(pk=message.pk).update(
        locked_until=now + timedelta(seconds=60),
        lock_token=uuid.uuid4(),
        claimed_by=dead.pk,
        attempt_open=True,
        attempts=1,
    )
    counts = json.loads(run("inbox_sweep"))
    assert (counts["given_back"], counts["done"]) == (1, 1)
    message.refresh_from_db()
    assert (message.state, message.attempts) == (InboxState.HANDLED, 2)


@pytest.mark.plain_retention
def test_inbox_purge_deletes_finished_messages_past_retention(configure_outbox):
    configure_outbox(INBOX={"SOURCES": {"shop": {"TRANSPORT": "local"}}})
    old = timezone.now() - timedelta(days=30)
    for n in range(3):
        message, _ = django_outbox.receive("t", {}, source="shop", message_id=f"old-{n}")
        InboxMessage.objects.filter(pk=message.pk).update(state=InboxState.HANDLED, finished_at=old)
    django_outbox.receive("t", {}, source="shop", message_id="waiting")
    assert "purged 3 message(s)" in run("inbox_purge")
    assert list(InboxMessage.objects.values_list("message_id", flat=True)) == ["waiting"]


@pytest.mark.jobs
@pytest.mark.plain_retention
def test_jobs_sweep_wakes_queues_and_jobs_purge_deletes_finished_jobs_and_idle_keys():
    from django_outbox.jobs.models import Job, JobKey, JobState
    from django_outbox.jobs.running import Jobs
    from testproject.shop import jobs

    jobs.order_step.enqueue(order=1, step=1)
    jobs.order_step.enqueue(order=2, step=1, fail=True)  # fails for good: holds order 2
    counts = json.loads(run("jobs_sweep"))
    assert counts["woken_queues"] == ["default"]
    Jobs().drain()
    old = timezone.now() - timedelta(days=30)
    Job.objects.update(finished_at=old)
    assert set(JobKey.objects.values_list("serial_key", flat=True)) == {"order-1", "order-2"}
    assert "purged 1 job(s)" in run("jobs_purge")
    # The failed job of order 2 is kept (it waits for an operator) and so is its key's
    # counter; order 1's counter goes with its last job.
    assert list(Job.objects.values_list("state", flat=True)) == [JobState.FAILED]
    assert list(JobKey.objects.values_list("serial_key", flat=True)) == ["order-2"]
    # A key used again starts over, behind nothing.
    again = jobs.order_step.enqueue(order=1, step=2)
    assert Job.objects.get(result_id=again.id).sequence == 1
    assert Jobs().drain().done == 1


@pytest.fixture
def loopback(configure_outbox):
    """This service's outbox delivers into its own inbox (the local transport), whose
    handler records what it handled; no kombu source and no Celery."""
    from django_outbox.inbox.handlers import handler, unregister

    configure_outbox(
        DESTINATIONS={"self": {"TRANSPORT": "local", "SOURCE": "self"}},
        INBOX={"SOURCES": {"self": {"TRANSPORT": "local"}}},
    )
    handled = []

    @handler("note.added")
    def note_added(message):
        handled.append(message.payload["n"])

    yield handled
    unregister("note.added")


def test_inbox_consume_without_a_kombu_source_handles_what_arrives_otherwise(loopback):
    for n in range(3):
        django_outbox.send("note.added", {"n": n}, to="self")
    run("outbox_relay", "--until-empty", "--interval", "0")

    out = run("inbox_consume", "--until-idle", "0")

    assert "no kombu source to consume; handling what is due from: self (local)" in out
    assert "inbox_consume stopped: 3 handled" in out
    assert sorted(loopback) == [0, 1, 2]


def test_inbox_consume_says_how_the_messages_of_other_sources_arrive(loopback, configure_outbox):
    with pytest.raises(CommandError, match="'self' is a local source, not kombu: its messages"):
        run("inbox_consume", "self")
    # The source only the destination names:
    configure_outbox(DESTINATIONS={"self": {"TRANSPORT": "local", "SOURCE": "self"}})
    with pytest.raises(CommandError, match="'self': its messages need no consumer"):
        run("inbox_consume", "self")
    with pytest.raises(CommandError, match="no kombu source to store from"):
        run("inbox_consume", "--no-handle")
