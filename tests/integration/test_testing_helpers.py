"""The helpers shipped in django_outbox.testing."""

import pytest
from django.db import transaction

import django_outbox
from django_outbox import testing

pytestmark = pytest.mark.django_db


def test_assert_message_recorded_finds_the_message_inside_the_transaction():
    with transaction.atomic():
        sent = django_outbox.send("order.created", {"order_id": 7, "total": 10}, key="order:7")
        found = testing.assert_message_recorded("order.created", {"order_id": 7}, key="order:7")
    assert found.pk == sent.pk


def test_assert_message_recorded_explains_what_was_recorded_instead():
    django_outbox.send("order.created", {"order_id": 7})
    with pytest.raises(AssertionError, match=r"found 0; recorded: order.created → default"):
        testing.assert_message_recorded("order.created", {"order_id": 8})
    django_outbox.send("order.created", {"order_id": 7})
    with pytest.raises(AssertionError, match="found 2"):
        testing.assert_message_recorded("order.created", {"order_id": 7})


@pytest.mark.django_db(transaction=True)
def test_deliver_now_publishes_to_the_memory_transport():
    django_outbox.send("order.created", {"order_id": 1})
    assert testing.deliver_now().sent == 1
    assert [e.payload for e in testing.published()] == [{"order_id": 1}]
    testing.clear_published()
    assert testing.published() == []
