"""Operator actions, written once in the engine (``engine.operator``), on each part: what
each moves, what it leaves alone, the keys it releases, the trigger it sends once
committed, and the races it must not lose."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from django_outbox.engine import operator, triggers
from django_outbox.engine.operator import Verb
from django_outbox.inbox.handlers import handler, unregister
from django_outbox.inbox.handling import Inbox
from django_outbox.jobs.models import Job, JobBatch, JobState
from django_outbox.jobs.running import Jobs
from django_outbox.models import InboxCursor, InboxMessage, InboxState, OutboxMessage, OutboxState
from tests.conftest import row_held_elsewhere
from tests.factories import OutboxMessageFactory

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = uuid.uuid4()
LATER = timezone.now() + timedelta(hours=1)


def last_attempt_marks(**extra):
    """What a failed row still carries of its last attempt when an operator finds it."""
    return {"attempts": 5, "attempt_open": True, "unclean_end": True, **extra}


def inbox_message(n, state=InboxState.HANDLE_ERROR, **fields):
    return InboxMessage.objects.create(
        source="s", message_id=f"m{n}", type="t", payload={}, state=state, **fields
    )


def job(state=JobState.FAILED, **fields):
    return Job.objects.create(task_path="testproject.shop.jobs.noop", state=state, **fields)


@pytest.fixture
def sent_triggers(configure_outbox, monkeypatch):
    """The triggers published, as (channel, ids), in the order they went out."""
    configure_outbox(DISPATCH="celery", DISPATCH_IN_BACKGROUND=False)
    sent: list[tuple[str, list]] = []
    monkeypatch.setattr(
        triggers, "_send_celery", lambda part, using, ids: sent.append((part, list(ids)))
    )
    return sent


# -- what each part allows ----------------------------------------------------------


def test_each_part_says_which_states_each_action_moves_rows_from():
    assert operator.sources(OutboxMessage, Verb.REQUEUE) == (OutboxState.SEND_ERROR,)
    assert set(operator.sources(OutboxMessage, Verb.CANCEL)) == {
        OutboxState.SHOULD_BE_SENT,
        OutboxState.SEND_ERROR,
    }
    assert operator.sources(OutboxMessage, Verb.SKIP) == ()
    assert operator.sources(InboxMessage, Verb.REQUEUE) == (InboxState.HANDLE_ERROR,)
    assert operator.sources(InboxMessage, Verb.CANCEL) == ()
    assert set(operator.sources(InboxMessage, Verb.SKIP)) == {
        InboxState.SHOULD_BE_HANDLED,
        InboxState.HANDLE_ERROR,
    }
    assert operator.sources(Job, Verb.REQUEUE) == (JobState.FAILED,)
    assert operator.sources(Job, Verb.CANCEL) == (JobState.READY,)
    assert operator.sources(Job, Verb.SKIP) == (JobState.FAILED,)
    assert operator.operations(Job).word(Verb.REQUEUE) == "retry"
    assert operator.operations(Job).past(Verb.REQUEUE) == "retried"


@pytest.mark.parametrize(
    ("model", "verb"), [(OutboxMessage, Verb.SKIP), (InboxMessage, Verb.CANCEL)]
)
def test_an_action_a_part_does_not_have_is_refused(model, verb):
    with pytest.raises(ValueError, match="cannot be"):
        operator.act(verb, model.objects.all())


def test_every_state_that_waits_for_an_operator_has_a_way_out():
    """The dead-letter state of every part can be requeued (retried) and given up on."""
    for model in (OutboxMessage, InboxMessage, Job):
        failed = operator.part_class(model).lifecycle.failed
        verbs = operator.verbs_from(model, failed)
        assert Verb.REQUEUE in verbs
        assert Verb.CANCEL in verbs or Verb.SKIP in verbs, model


def test_models_do_not_import_their_parts_runners():
    from pathlib import Path

    import django_outbox

    root = Path(django_outbox.__file__).parent
    for module, runner in (
        ("outbox/models.py", "outbox.relay"),
        ("inbox/models.py", "inbox.handling"),
        ("jobs/models.py", "jobs.running"),
    ):
        assert runner not in (root / module).read_text(), module


# -- requeue ----------------------------------------------------------------------


def test_requeue_makes_failed_outbox_messages_due_with_a_clean_slate():
    failed = OutboxMessageFactory(
        state=OutboxState.SEND_ERROR,
        uncertain=True,
        last_error="HTTP 503",
        available_at=LATER,
        lock_token=TOKEN,
        claimed_by=TOKEN,
        **last_attempt_marks(),
    )
    sent = OutboxMessageFactory(state=OutboxState.SENT, sent_at=LATER, finished_at=LATER)
    moved = operator.requeue(OutboxMessage.objects.all())
    assert moved.ids == [failed.pk]
    failed.refresh_from_db()
    assert failed.state == OutboxState.SHOULD_BE_SENT
    assert (failed.attempts, failed.attempt_open, failed.unclean_end) == (0, False, False)
    assert (failed.lock_token, failed.claimed_by, failed.uncertain) == (None, None, False)
    assert failed.available_at <= timezone.now()
    assert failed.last_error == "HTTP 503"  # kept for the record
    sent.refresh_from_db()
    assert sent.state == OutboxState.SENT


def test_requeue_makes_failed_inbox_messages_due_again():
    failed = inbox_message(1, last_error="boom", available_at=LATER, **last_attempt_marks())
    handled = inbox_message(2, state=InboxState.HANDLED, finished_at=LATER)
    assert InboxMessage.objects.requeue() == 1
    failed.refresh_from_db()
    assert (failed.state, failed.attempts) == (InboxState.SHOULD_BE_HANDLED, 0)
    assert (failed.attempt_open, failed.unclean_end) == (False, False)
    assert failed.available_at <= timezone.now()
    handled.refresh_from_db()
    assert handled.state == InboxState.HANDLED


def test_retry_runs_failed_jobs_again_unless_their_unique_key_is_taken():
    plain = job(finished_at=LATER, resolution="cancelled", **last_attempt_marks())
    keyed = job(unique_key="sync-1")
    job(state=JobState.READY, unique_key="sync-1")  # holds the key
    twins = [job(unique_key="sync-2") for _ in range(2)]
    assert Job.objects.retry() == 2
    plain.refresh_from_db()
    assert (plain.state, plain.attempts, plain.finished_at) == (JobState.READY, 0, None)
    assert (plain.resolution, plain.attempt_open, plain.unclean_end) == ("", False, False)
    keyed.refresh_from_db()
    assert keyed.state == JobState.FAILED
    states = [Job.objects.get(pk=twin.pk).state for twin in twins]
    assert states == [JobState.READY, JobState.FAILED]  # the oldest of the two


def test_requeue_sends_the_trigger_once_committed(sent_triggers):
    """Given failed messages and jobs, a requeue inside a transaction triggers nothing
    until the commit, then the relay, the handlers and each queue's workers at once (no
    waiting for the sweep)."""
    OutboxMessageFactory(state=OutboxState.SEND_ERROR)
    inbox_message(1)
    job(queue_name="default")
    job(queue_name="emails")
    with transaction.atomic():
        assert OutboxMessage.objects.requeue() == 1
        assert InboxMessage.objects.requeue() == 1
        assert Job.objects.retry() == 2
        assert sent_triggers == []
    assert sent_triggers == [
        ("outbox", []),
        ("inbox", []),
        ("jobs:default", []),
        ("jobs:emails", []),
    ]


def test_a_requeue_that_moves_nothing_triggers_nothing(sent_triggers):
    OutboxMessageFactory(state=OutboxState.SENT, sent_at=LATER, finished_at=LATER)
    assert OutboxMessage.objects.requeue() == 0
    assert sent_triggers == []


def test_a_retried_job_runs_at_the_trigger(sent_triggers):
    """The trigger is what runs it: one drain of its queue, as the Celery task does."""
    failed = job(queue_name="default")
    Job.objects.retry()
    [(channel, ids)] = sent_triggers
    Jobs(queues=[channel.split(":")[1]]).deliver(ids)
    failed.refresh_from_db()
    assert failed.state == JobState.SUCCESSFUL


# -- cancel ---------------------------------------------------------------------------


def test_cancel_ends_outbox_messages_not_being_sent_and_releases_their_keys():
    head = OutboxMessageFactory(
        state=OutboxState.SEND_ERROR, key="k", sequence=1, blocking=True, **last_attempt_marks()
    )
    parked = OutboxMessageFactory(key="k", sequence=2, blocked=True)
    sending = OutboxMessageFactory(state=OutboxState.SENDING, locked_until=LATER, lock_token=TOKEN)
    moved = operator.cancel(OutboxMessage.objects.filter(pk__in=[head.pk, sending.pk]))
    assert (moved.ids, moved.woken) == ([head.pk], 1)
    head.refresh_from_db()
    assert (head.state, head.blocking, head.attempt_open) == (OutboxState.CANCELLED, False, False)
    assert head.finished_at is not None
    parked.refresh_from_db()
    assert (parked.state, parked.blocked) == (OutboxState.SHOULD_BE_SENT, False)
    sending.refresh_from_db()
    assert sending.state == OutboxState.SENDING  # its relay may be publishing it now


def test_cancel_ends_ready_jobs_and_asks_running_ones_to_stop():
    ready = job(state=JobState.READY)
    running = job(state=JobState.RUNNING, locked_until=LATER, lock_token=TOKEN)
    done = job(state=JobState.SUCCESSFUL, finished_at=LATER)
    moved = operator.cancel(Job.objects.all())
    assert (moved.ids, moved.stopping) == ([ready.pk], [running.pk])
    ready.refresh_from_db()
    assert (ready.state, ready.resolution) == (JobState.FAILED, "cancelled")
    assert ready.last_error == "cancelled before it ran" and ready.finished_at is not None
    running.refresh_from_db()
    assert (running.state, running.cancel_requested) == (JobState.RUNNING, True)
    done.refresh_from_db()
    assert (done.state, done.cancel_requested) == (JobState.SUCCESSFUL, False)


def test_cancelling_the_last_job_of_a_batch_completes_it():
    batch = JobBatch.objects.create(
        total=1, callback_path="testproject.shop.jobs.batch_done", callback_kwargs={"tag": "t"}
    )
    job(state=JobState.READY, batch=batch)
    assert Job.objects.cancel() == 1
    batch.refresh_from_db()
    assert (batch.succeeded, batch.failed) == (0, 1) and batch.finished_at is not None


@pytest.mark.row_locks
@pytest.mark.jobs
def test_a_job_claimed_while_it_is_cancelled_is_cancelled_or_asked_to_stop():
    """Given a READY job, when a worker claims it between the statements of a cancel,
    then the job is either cancelled or, running, asked to stop: never neither."""
    ready = job(state=JobState.READY)
    claimed: list = []

    def claim_elsewhere():
        try:
            claimed.extend(Jobs().claim_batch()[0])
        finally:
            connections.close_all()

    first_update = True

    def between_statements(execute, sql, params, many, context):
        nonlocal first_update
        result = execute(sql, params, many, context)
        if first_update and sql.lstrip().upper().startswith("UPDATE"):
            first_update = False
            worker = threading.Thread(target=claim_elsewhere)
            worker.start()
            worker.join(timeout=10)
        return result

    with connection.execute_wrapper(between_statements):
        Job.objects.filter(pk=ready.pk).cancel()
    ready.refresh_from_db()
    cancelled = ready.state == JobState.FAILED and ready.resolution == "cancelled"
    asked = ready.state == JobState.RUNNING and ready.cancel_requested
    assert cancelled or asked, (ready.state, ready.cancel_requested, claimed)


# -- skip -------------------------------------------------------------------------------


def test_skip_ends_failed_jobs_and_releases_their_serial_keys():
    head = job(serial_key="k", sequence=1, blocking=True)
    parked = job(state=JobState.READY, serial_key="k", sequence=2, blocked=True)
    already = job(resolution="skipped")
    moved = operator.skip(Job.objects.all())
    assert (moved.ids, moved.woken) == ([head.pk], 1)
    head.refresh_from_db()
    assert (head.state, head.resolution, head.blocking) == (JobState.FAILED, "skipped", False)
    parked.refresh_from_db()
    assert not parked.blocked
    already.refresh_from_db()
    assert already.resolution == "skipped"


def test_skip_ends_waiting_or_failed_inbox_messages():
    waiting = inbox_message(1, state=InboxState.SHOULD_BE_HANDLED)
    failed = inbox_message(2, lock_token=TOKEN, **last_attempt_marks())
    handled = inbox_message(3, state=InboxState.HANDLED, finished_at=LATER)
    assert InboxMessage.objects.skip() == 2
    for message in (waiting, failed):
        message.refresh_from_db()
        assert message.state == InboxState.SKIPPED and message.finished_at is not None
        assert message.last_error == "skipped by an operator"
        assert (message.lock_token, message.attempt_open) == (None, False)
    handled.refresh_from_db()
    assert handled.state == InboxState.HANDLED


@pytest.fixture
def strict_step():
    """A strict handler that fails for payloads that say so; records what it handled."""
    done: list[int] = []

    @handler("step", ordering="strict")
    def step(message):
        if message.payload.get("fail"):
            raise ValueError("cannot do this step")
        done.append(message.sequence)

    yield done
    unregister("step")


def receive_step(sequence, **payload):
    import django_outbox

    message, _ = django_outbox.receive(
        "step", payload, source="s", message_id=f"step-{sequence}", key="k", sequence=sequence
    )
    return message


def test_skipping_a_failed_strict_message_lets_its_key_go_on(strict_step, sent_triggers):
    """Given a strict key whose sequence 2 failed and whose 3 waits for it, when an
    operator skips 2, then 3 is handled at the next drain (no gap alert to wait for)."""
    receive_step(1)
    failed = receive_step(2, fail=True)
    Inbox().drain()
    failed.refresh_from_db()
    assert failed.state == InboxState.HANDLE_ERROR
    waiting = receive_step(3)
    Inbox().drain()
    waiting.refresh_from_db()
    assert waiting.last_error.startswith("waiting for sequence 2")
    sent_triggers.clear()

    assert InboxMessage.objects.filter(pk=failed.pk).skip() == 1

    assert InboxCursor.objects.get(source="s", key="k").last_sequence == 2
    assert sent_triggers == [("inbox", [])]
    Inbox().drain()
    waiting.refresh_from_db()
    assert waiting.state == InboxState.HANDLED
    assert strict_step[-1] == 3


def test_skipping_wakes_a_successor_another_transaction_holds_once_it_lets_go(strict_step):
    """The successor of a skipped message is held by another transaction (on InnoDB, a
    claim scanning the table) when the skip wakes it: it is woken once the skip has
    committed, waiting for the holder, rather than left to its gap alert."""
    receive_step(1)
    failed = receive_step(2, fail=True)
    Inbox().drain()
    waiting = receive_step(3)
    Inbox().drain()
    waiting.refresh_from_db()
    assert waiting.available_at > timezone.now()
    with row_held_elsewhere(InboxMessage.objects.filter(pk=waiting.pk)):
        assert InboxMessage.objects.filter(pk=failed.pk).skip() == 1
    waiting.refresh_from_db()
    assert waiting.available_at <= timezone.now()
    Inbox().drain()
    waiting.refresh_from_db()
    assert waiting.state == InboxState.HANDLED
    assert strict_step[-1] == 3


def test_skipping_the_first_message_of_a_strict_key_before_any_was_handled(strict_step):
    first = receive_step(1)
    waiting = receive_step(2)
    InboxMessage.objects.filter(pk=first.pk).skip()
    Inbox().drain()
    waiting.refresh_from_db()
    assert waiting.state == InboxState.HANDLED
    assert InboxCursor.objects.get(source="s", key="k").last_sequence == 2


def test_skipping_ahead_of_a_strict_key_s_cursor_moves_nothing_until_its_turn(strict_step):
    """Sequence 3 skipped while 2 is still awaited moves nothing; skipping 2 then passes
    both, and 4 is handled."""
    receive_step(1)
    Inbox().drain()
    second, third, fourth = (receive_step(n) for n in (2, 3, 4))
    InboxMessage.objects.filter(pk=second.pk).update(state=InboxState.HANDLE_ERROR)
    InboxMessage.objects.filter(pk=third.pk).skip()
    assert InboxCursor.objects.get(source="s", key="k").last_sequence == 1
    InboxMessage.objects.filter(pk=second.pk).skip()
    assert InboxCursor.objects.get(source="s", key="k").last_sequence == 3
    Inbox().drain()
    fourth.refresh_from_db()
    assert fourth.state == InboxState.HANDLED
    assert strict_step == [1, 4]


def test_handling_the_message_before_one_skipped_ahead_passes_it_too(strict_step):
    """Sequence 3 skipped while 2 is awaited: when 2 is handled, the cursor passes the
    skipped 3 as well, and 4 is handled at once instead of waiting for a gap alert."""
    receive_step(1)
    Inbox().drain()
    _second, third, fourth = (receive_step(n) for n in (2, 3, 4))
    InboxMessage.objects.filter(pk=third.pk).skip()
    assert InboxCursor.objects.get(source="s", key="k").last_sequence == 1
    Inbox().drain()
    assert InboxCursor.objects.get(source="s", key="k").last_sequence == 4
    fourth.refresh_from_db()
    assert fourth.state == InboxState.HANDLED
    assert strict_step == [1, 2, 4]
