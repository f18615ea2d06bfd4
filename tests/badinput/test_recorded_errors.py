"""Error texts with a NUL in them (an exception's text, a destination's answer) are
recorded escaped: PostgreSQL refuses a NUL in any text, and before they were escaped
the outcome was never recorded and the row stayed claimed, failing again each time."""

import pytest

import django_outbox
from django_outbox.jobs.models import Job, JobState
from django_outbox.jobs.running import Jobs
from django_outbox.models import OutboxMessage, OutboxState
from django_outbox.outbox.relay import Relay
from tests.badinput import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_job_whose_exception_text_has_a_nul_is_failed_with_it_escaped():
    tasks.fails_with_nul.enqueue()
    assert Jobs().drain().failed == 1
    job = Job.objects.get()
    assert (job.state, job.claimed_by) == (JobState.FAILED, None)
    assert job.last_error == "gave up after 1 attempt: RuntimeError: bad byte: a\\x00b"
    assert "a\\x00b" in job.errors[0]["traceback"]


def test_a_destination_answer_with_a_nul_is_recorded_escaped(configure_outbox):
    configure_outbox(DESTINATIONS={"default": {"TRANSPORT": "tests.badinput.tasks.RefusesWithNul"}})
    django_outbox.send("order.paid", {"n": 1})
    assert Relay().drain().failed == 1
    message = OutboxMessage.objects.get()
    assert (message.state, message.last_error) == (OutboxState.SEND_ERROR, "refused: a\\x00b")


def test_a_job_that_returns_a_nul_is_failed_with_the_reason_not_left_running():
    tasks.returns_nul.enqueue()
    assert Jobs().drain().failed == 1
    job = Job.objects.get()
    assert (job.state, job.attempts, job.claimed_by) == (JobState.FAILED, 1, None)
    assert "value['text'] contains a NUL character" in job.last_error
    assert "not retried" in job.last_error


def test_a_batch_whose_callback_fails_with_a_nul_keeps_the_reason_escaped():
    from django_outbox.jobs import batches
    from django_outbox.jobs.models import JobBatch

    row = JobBatch.objects.create(total=1)
    batches._record_error("default", row.pk, ValueError("callback\x00broke"))
    row.refresh_from_db()
    assert row.last_error == "ValueError: callback\\x00broke"
