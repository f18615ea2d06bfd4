"""The on-commit trigger tasks: each drains what is due, its own rows among it, in as few
batches as the rows need; a trigger is a wake-up, not a list of the only rows to run."""

import uuid

import pytest

import django_outbox
from django_outbox.jobs.models import Job
from django_outbox.models import InboxMessage, InboxState, OutboxMessage, OutboxState
from django_outbox.outbox.relay import Relay
from django_outbox.outbox.transports.memory import mailbox
from django_outbox.tasks import deliver_messages, handle_inbox, run_jobs
from testproject.shop import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_trigger_runs_its_rows_and_those_committed_since_in_one_batch():
    """Rows of transactions whose triggers are still on their way go out with the
    trigger's own, in the same batch: their triggers then find nothing left."""
    own = django_outbox.send("own", {})
    later = django_outbox.send("later", {})
    result = deliver_messages([own.pk])
    assert (result["sent"], result["batches"]) == (2, 1)
    assert sorted(e.type for e in mailbox["default"]) == ["later", "own"]
    # The later trigger comes to an empty table: one claim, nothing sent twice.
    assert deliver_messages([later.pk])["claimed"] == 0
    assert len(mailbox["default"]) == 2


def test_a_trigger_whose_rows_were_taken_still_runs_what_is_due():
    first = django_outbox.send("first", {})
    Relay().drain()
    django_outbox.send("second", {})  # due, committed after the first's trigger left
    assert deliver_messages([first.pk])["sent"] == 1
    assert [e.type for e in mailbox["default"]] == ["first", "second"]
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {OutboxState.SENT}


def test_a_jobs_trigger_runs_the_due_jobs_of_its_queue_in_one_batch():
    own = Job.objects.get(result_id=jobs.noop.enqueue().id)
    jobs.noop.enqueue()
    result = run_jobs([own.pk], queue="default")
    assert (result["done"], result["batches"]) == (2, 1)


def test_an_inbox_trigger_handles_the_due_messages_in_one_batch():
    own, _ = django_outbox.receive(
        "payment.captured", {"order": "o1"}, source="payments", message_id=str(uuid.uuid4())
    )
    django_outbox.receive(
        "payment.captured", {"order": "o2"}, source="payments", message_id=str(uuid.uuid4())
    )
    result = handle_inbox([own.pk])
    assert (result["done"], result["batches"]) == (2, 1)
    assert set(InboxMessage.objects.values_list("state", flat=True)) == {InboxState.HANDLED}
