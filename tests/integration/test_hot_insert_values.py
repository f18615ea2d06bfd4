"""The single-row inserts of send(), enqueue() and receive() (``engine.insert``) store
awkward values as they were given, on every database."""

from datetime import UTC, datetime

import pytest
from django.db import transaction

import django_outbox
from django_outbox.jobs.models import Job
from django_outbox.models import InboxMessage, OutboxMessage
from testproject.shop import jobs

pytestmark = pytest.mark.django_db

#: Text that quoting into a statement's text has to get right: quotes, a percent sign,
#: a backslash, non-ASCII and a JSON-looking string.
AWKWARD = 'it\'s 100% \\ naïve \u2603 {"not": "an object"}'


def test_values_arrive_as_they_were_sent():
    moment = datetime(2026, 11, 28, 12, 30, 15, 123456, tzinfo=UTC)
    payload = {"note": AWKWARD, "n": 12345678901234, "x": 1.5, "none": None, "list": [AWKWARD]}
    with transaction.atomic():
        sent = django_outbox.send("order.created", payload, headers={"h": AWKWARD})
        enqueued = jobs.add.using(run_after=moment).enqueue(AWKWARD, payload)
    stored, _ = django_outbox.receive(
        "payment.captured", payload, message_id=f"m-{AWKWARD}", source="payments"
    )

    message = OutboxMessage.objects.get(pk=sent.pk)
    assert (message.payload, message.headers["h"]) == (payload, AWKWARD)
    job = Job.objects.get(result_id=enqueued.id)
    assert (job.args, job.run_after) == ([AWKWARD, payload], moment)
    row = InboxMessage.objects.get(pk=stored.pk)
    assert (row.payload, row.message_id) == (payload, f"m-{AWKWARD}")
