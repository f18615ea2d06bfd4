"""The database itself refuses rows that break the state machine's invariants."""

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from django_outbox.models import OutboxState
from tests.factories import OutboxMessageFactory

pytestmark = pytest.mark.django_db

TOKEN = "7e9c9e0e-0000-4000-8000-000000000000"


@pytest.mark.parametrize(
    "fields",
    [
        {"state": "lost"},
        {"state": OutboxState.SENT, "finished_at": timezone.now()},  # no sent_at
        {"state": OutboxState.CANCELLED},  # no finished_at
        {"state": OutboxState.SENDING, "locked_until": timezone.now()},  # no token
        {"key": "k"},  # a key needs a sequence
        {"sequence": 3},  # and a sequence a key
    ],
    ids=[
        "unknown-state",
        "sent-without-sent_at",
        "finished-without-finished_at",
        "sending-without-lease",
        "key-without-sequence",
        "sequence-without-key",
    ],
)
def test_invariant_violations_are_refused(fields):
    with pytest.raises(IntegrityError), transaction.atomic():
        OutboxMessageFactory(**fields)


def test_a_key_cannot_hold_the_same_sequence_twice():
    OutboxMessageFactory(key="k", sequence=1)
    OutboxMessageFactory(key="k", sequence=1, destination="held")  # other destination: fine
    with pytest.raises(IntegrityError), transaction.atomic():
        OutboxMessageFactory(key="k", sequence=1)


def test_valid_rows_in_every_state_are_accepted():
    now = timezone.now()
    OutboxMessageFactory(state=OutboxState.SHOULD_BE_SENT)
    OutboxMessageFactory(state=OutboxState.SENDING, locked_until=now, lock_token=TOKEN)
    OutboxMessageFactory(state=OutboxState.SENT, sent_at=now, finished_at=now)
    OutboxMessageFactory(state=OutboxState.SEND_ERROR, last_error="boom")
    OutboxMessageFactory(state=OutboxState.CANCELLED, finished_at=now)
