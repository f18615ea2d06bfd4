"""A claimed outgoing message keeps its payload's stored text and decodes it only when
something reads it (``KeptJSONField``): the row and its envelope must behave in every
other way as if it had been decoded at once."""

import copy
import dataclasses
import json
import pickle
from decimal import Decimal

import pytest
from django.db.models.signals import post_init

import django_outbox
from django_outbox.outbox.envelope import Envelope
from django_outbox.outbox.models import OutboxMessage
from django_outbox.outbox.relay import Relay

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]  # the claim that keeps the text

PAYLOAD = {"order": 7, "total": Decimal("10.50"), "lines": [{"sku": "a"}], "note": "é"}
STORED = {"order": 7, "total": "10.50", "lines": [{"sku": "a"}], "note": "é"}


def claimed():
    """The one message sent, as the relay's claim hands it over."""
    [row], _ = Relay(batch_size=10).claim_batch()
    return row


def test_a_claimed_row_decodes_its_payload_only_when_read():
    django_outbox.send("order.created", PAYLOAD)
    row = claimed()
    assert "payload" not in vars(row)  # not decoded by the claim
    assert isinstance(row.__dict__["payload_json"], str)
    assert row.payload == STORED
    assert vars(row)["payload"] is row.payload  # decoded once, then kept


def test_a_claimed_row_is_not_deferred_and_saves_its_payload():
    django_outbox.send("order.created", PAYLOAD)
    row = claimed()
    assert "payload" not in row.get_deferred_fields()  # the claim reads only some fields
    row.last_error = "noted"
    row.save()  # the loaded fields written, the payload among them, unchanged
    assert OutboxMessage.objects.get(pk=row.pk).payload == STORED
    row = OutboxMessage.objects.get(pk=row.pk)  # an ordinary load is not affected
    assert "payload" in vars(row) and "payload_json" not in vars(row)


def test_a_claimed_row_s_payload_can_be_replaced_and_saved():
    django_outbox.send("order.created", PAYLOAD)
    row = claimed()
    row.payload = {"order": 8}
    assert "payload_json" not in vars(row)  # the kept text is not the value any more
    assert Envelope.from_message(row).body() == b'{"order":8}'
    row.save()
    assert OutboxMessage.objects.get(pk=row.pk).payload == {"order": 8}


def test_a_claimed_row_refreshed_reads_the_payload_stored_now():
    message = django_outbox.send("order.created", PAYLOAD)
    row = claimed()
    OutboxMessage.objects.filter(pk=message.pk).update(payload={"order": 9})
    row.refresh_from_db()
    assert row.payload == {"order": 9}
    assert Envelope.from_message(row).body() == b'{"order":9}'


def test_a_deferred_payload_still_loads_from_the_database():
    message = django_outbox.send("order.created", PAYLOAD)
    row = OutboxMessage.objects.defer("payload").get(pk=message.pk)
    assert row.get_deferred_fields() == {"payload"}
    assert row.payload == STORED


def test_a_copied_or_pickled_claimed_row_keeps_its_payload():
    django_outbox.send("order.created", PAYLOAD)
    row = claimed()
    assert pickle.loads(pickle.dumps(row)).payload == STORED
    assert copy.copy(row).payload == STORED


def test_with_an_init_receiver_the_claim_decodes_at_once():
    # A post_init receiver sees each instance as it is made: the payload must be there.
    django_outbox.send("order.created", PAYLOAD)
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(dict(vars(instance)))

    post_init.connect(receiver, sender=OutboxMessage)
    try:
        row = claimed()
    finally:
        post_init.disconnect(receiver, sender=OutboxMessage)
    assert seen and seen[0]["payload"] == STORED
    assert vars(row)["payload"] == STORED


def test_an_envelope_of_a_claimed_row_decodes_its_payload_when_read():
    django_outbox.send("order.created", PAYLOAD, key="k", headers={"tenant": "acme"})
    row = claimed()
    envelope = Envelope.from_message(row)
    assert "payload" not in vars(row)  # the envelope did not read it either
    assert envelope.body_text() == row.__dict__["payload_json"]
    assert envelope.payload == STORED
    expected = Envelope(
        message_id=row.message_id,
        type="order.created",
        destination="default",
        payload=STORED,
        key="k",
        sequence=1,
        correlation_id=None,
        created_at=row.created_at,
        attempt=row.attempts,
        user_headers={"tenant": "acme"},
        payload_json=row.__dict__["payload_json"],
        message_id_text=str(row.message_id),
    )
    assert Envelope.from_message(row) == expected
    assert expected == Envelope.from_message(row)


def test_a_lazy_envelope_compares_copies_and_pickles_as_a_built_one():
    django_outbox.send("order.created", PAYLOAD)
    row = claimed()
    for made in (
        lambda: dataclasses.replace(Envelope.from_message(row), attempt=5),
        lambda: pickle.loads(pickle.dumps(Envelope.from_message(row))),
        lambda: copy.deepcopy(Envelope.from_message(row)),
    ):
        assert made().payload == STORED
    assert "order.created" in repr(Envelope.from_message(row))
    with pytest.raises(dataclasses.FrozenInstanceError):
        Envelope.from_message(row).payload = {}
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        Envelope.from_message(row).nothing  # noqa: B018


def test_an_envelope_of_an_unclaimed_row_has_its_payload_at_once():
    message = django_outbox.send("order.created", PAYLOAD)
    envelope = Envelope.from_message(OutboxMessage.objects.get(pk=message.pk))
    assert envelope.payload == STORED
    assert envelope.payload_json is None
    assert json.loads(envelope.body()) == STORED
