"""receive(): each bad call raises before anything is stored, and the caller's
transaction stays usable; a duplicate and an unknown type are accepted."""

import re

import pytest
from django.db import transaction

import django_outbox
from django_outbox import exceptions
from django_outbox.inbox.handling import Inbox
from django_outbox.models import InboxMessage
from tests.badinput.cases import ACCEPTED, RAISES, RECEIVE
from tests.badinput.support import grown, params, table_counts

pytestmark = pytest.mark.django_db

INBOX = InboxMessage._meta.db_table
GOOD = {
    "type": "payment.captured",
    "payload": {"order": "o1"},
    "source": "shop",
    "message_id": "m-1",
}


def call(arguments):
    arguments = dict(arguments)
    return django_outbox.receive(arguments.pop("type"), arguments.pop("payload"), **arguments)


@pytest.mark.parametrize("case", params(RECEIVE))
def test_receive(case):
    given = dict(case.given)
    twice = given.pop("twice", False)
    handle = given.pop("handle", False)
    arguments = {**GOOD, **given, "trigger": False}
    before = table_counts()
    expect = case.expect
    with transaction.atomic():
        if expect.kind == RAISES:
            with pytest.raises(getattr(exceptions, expect.what), match=re.escape(expect.says)):
                call(arguments)
            call({**GOOD, "message_id": "after-refusal", "trigger": False})
        else:
            assert expect.kind == ACCEPTED
            first, created = call(arguments)
            assert created
            if twice:
                again, created = call(arguments)
                assert (again.pk, created, expect.what) == (first.pk, False, "created=False")
    assert grown(before, table_counts()) == {INBOX: 1}
    if expect.kind == RAISES:
        assert InboxMessage.objects.get().message_id == "after-refusal"
    elif handle:
        Inbox().drain()
        row = InboxMessage.objects.get()
        assert (row.state, expect.says in row.last_error) == (expect.what, True), row.last_error
