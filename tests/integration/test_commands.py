"""Management commands, driven with call_command."""

import io
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

import django_outbox
from django_outbox.models import OutboxMessage, OutboxState
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


def test_outbox_relay_max_batches_stops_early():
    for n in range(25):
        django_outbox.send("t", {"n": n})
    run("outbox_relay", "--max-batches", "1", "--batch", "10", "--interval", "0")
    assert OutboxMessage.objects.filter(state=OutboxState.SENT).count() == 10


@pytest.mark.parametrize("bad", [["--batch", "0"], ["--interval", "-1"], ["--batch", "x"]])
def test_outbox_relay_rejects_bad_arguments(bad):
    with pytest.raises(CommandError):
        call_command("outbox_relay", *bad)


def test_outbox_sweep_rescues_and_delivers():
    message = django_outbox.send("t", {})
    leave_sending(message, lease_ends_in=-5)
    counts = json.loads(run("outbox_sweep"))
    assert (counts["resent"], counts["sent"]) == (1, 1)


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


def test_outbox_relay_survives_a_database_error(monkeypatch):
    from django.db import OperationalError

    from django_outbox.engine.loop import WorkerLoop as RelayWorker
    from django_outbox.outbox.relay import Relay

    django_outbox.send("t", {})
    real_drain = Relay.drain
    failures = []

    def flaky_drain(self, **kwargs):
        if not failures:
            failures.append(1)
            raise OperationalError("server closed the connection unexpectedly")
        return real_drain(self, **kwargs)

    monkeypatch.setattr(Relay, "drain", flaky_drain)
    worker = RelayWorker(Relay(), interval=0, until_empty=True, listen=False)
    worker.retry_delay = 0
    total = worker.run()
    assert (worker.errors, total.sent) == (1, 1)


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
