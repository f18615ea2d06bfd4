"""Log lines carry structured fields (``extra``) and say each failure once: a retry at
WARNING, a dead letter at ERROR, for the outbox, the inbox and the jobs."""

from __future__ import annotations

import logging
import uuid

import pytest
from django.db import transaction

import django_outbox
from django_outbox.inbox.handlers import handler, unregister
from django_outbox.inbox.handling import Inbox
from django_outbox.jobs.models import Job
from django_outbox.jobs.running import Jobs
from django_outbox.outbox.relay import Relay
from testproject.shop import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def failures(caplog, part):
    return [
        r for r in caplog.records if getattr(r, "part", None) == part and hasattr(r, "will_retry")
    ]


def test_an_outbox_retry_is_a_warning_and_its_dead_letter_one_error_with_fields(
    configure_outbox, caplog
):
    configure_outbox(
        DESTINATIONS={"default": {"TRANSPORT": "tests.support.ScriptedTransport"}},
        MAX_ATTEMPTS=2,
        RETRY_BASE_SECONDS=0.0,
        RETRY_MAX_SECONDS=0.0,
    )
    with transaction.atomic():
        message = django_outbox.send("fail.retry", {}, key="order-7")
    caplog.set_level(logging.INFO, logger="django_outbox")

    Relay().drain()
    Relay().drain()

    first, second = failures(caplog, "outbox")
    assert (first.levelno, first.will_retry, first.attempt) == (logging.WARNING, True, 1)
    assert (second.levelno, second.will_retry, second.attempt) == (logging.ERROR, False, 2)
    for record in (first, second):
        assert record.id == str(message.message_id)
        assert (record.type, record.destination, record.key) == ("fail.retry", "default", "order-7")
        assert "worker" in record.__dict__
    # Every line of the part's logger says which part it is about.
    lines = [r for r in caplog.records if r.name == "django_outbox.outbox"]
    assert len(lines) >= 2
    assert {r.part for r in lines} == {"outbox"}


def test_a_handler_failure_is_logged_once_at_error_with_the_inbox_fields(caplog):
    @handler("logged.broken")
    def broken(message):
        raise ValueError("no such order")

    caplog.set_level(logging.INFO, logger="django_outbox")
    try:
        django_outbox.receive(
            "logged.broken", {}, source="payments", message_id="pay-1", key="order-1", sequence=1
        )
        Inbox().drain()
    finally:
        unregister("logged.broken")

    [record] = failures(caplog, "inbox")
    assert record.levelno == logging.ERROR
    assert (record.id, record.type, record.source, record.key) == (
        "pay-1",
        "logged.broken",
        "payments",
        "order-1",
    )
    assert record.attempt == 1 and record.will_retry is False
    assert "no such order" in record.getMessage()


def test_job_attempts_warn_until_the_last_which_is_an_error(caplog):
    caplog.set_level(logging.INFO, logger="django_outbox")
    result = jobs.always_fails.enqueue("broken")
    for _ in range(5):
        Jobs().drain()
        # The retries' backoff, skipped: due again now.
        Job.objects.update(available_at=Job.objects.get().created_at)

    records = failures(caplog, "jobs")
    assert [r.levelno for r in records] == [logging.WARNING, logging.WARNING, logging.ERROR]
    assert [r.attempt for r in records] == [1, 2, 3]
    assert {r.id for r in records} == {str(uuid.UUID(result.id))}
    assert {r.task for r in records} == {"testproject.shop.jobs.always_fails"}
    assert {r.queue for r in records} == {"default"}
