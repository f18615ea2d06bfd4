"""send(): each bad call raises before anything is stored, and the caller's
transaction stays usable (a good send in it afterwards commits)."""

import re

import pytest
from django.db import transaction

import django_outbox
from django_outbox import exceptions
from django_outbox.models import OutboxMessage
from tests.badinput.cases import ACCEPTED, RAISES, SEND
from tests.badinput.support import grown, params, table_counts

pytestmark = pytest.mark.django_db

OUTBOX = OutboxMessage._meta.db_table
GOOD = {"type": "order.paid", "payload": {"order": 1}}


@pytest.mark.parametrize("case", params(SEND))
def test_send(case, configure_outbox):
    given = dict(case.given)
    if "max_payload_bytes" in given:
        configure_outbox(MAX_PAYLOAD_BYTES=given.pop("max_payload_bytes"))
    call = {**GOOD, **given}
    before = table_counts()
    expect = case.expect
    with transaction.atomic():
        if expect.kind == RAISES:
            with pytest.raises(getattr(exceptions, expect.what), match=re.escape(expect.says)):
                django_outbox.send(call.pop("type"), call.pop("payload"), **call)
            # The caller's transaction is still usable.
            django_outbox.send("after.refusal", {})
        else:
            assert expect.kind == ACCEPTED
            message = django_outbox.send(call.pop("type"), call.pop("payload"), **call)
    if expect.kind == RAISES:
        assert grown(before, table_counts()) == {OUTBOX: 1}
        assert OutboxMessage.objects.get().type == "after.refusal"
    else:
        assert grown(before, table_counts()) == {OUTBOX: 1}
        stored = OutboxMessage.objects.get(pk=message.pk)
        assert stored.state == expect.what
        assert stored.payload == message.payload
        assert f"`{_json(stored.payload)}`" in expect.stored


def _json(value):
    import json

    return json.dumps(value, sort_keys=True)
