"""Reading a delivery: which content types are read as JSON (docs/inbox.md, "Bad input
is kept, not dropped")."""

import pytest

from django_outbox.conf import Source
from django_outbox.inbox.intake import Arrival, Unreadable, parse
from django_outbox.wire import HEADER_MESSAGE_ID, HEADER_TYPE

SOURCE = Source(name="orders", transport="kombu")
HEADERS = {HEADER_MESSAGE_ID: "m-1", HEADER_TYPE: "order.paid"}


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "application/json",
        "application/json; charset=utf-8",
        "application/x-json",
        "text/plain",
        "Text/Plain; charset=utf-8",
    ],
)
def test_json_bodies_are_read_whatever_json_label_they_carry(content_type):
    """kombu labels a body published as a string text/plain: it is read as JSON."""
    arrival = Arrival(SOURCE, b'{"total": 5}', HEADERS, content_type=content_type)

    assert parse(arrival).payload == {"total": 5}


def test_a_text_plain_body_that_is_not_json_is_unreadable_for_that_reason():
    arrival = Arrival(SOURCE, b"total=5", HEADERS, content_type="text/plain")

    with pytest.raises(Unreadable, match="body is not UTF-8 JSON"):
        parse(arrival)


@pytest.mark.parametrize("content_type", ["text/html", "application/xml", "application/data"])
def test_other_content_types_are_unreadable(content_type):
    arrival = Arrival(SOURCE, b'{"total": 5}', HEADERS, content_type=content_type)

    with pytest.raises(Unreadable, match=f"content type '{content_type}' is not JSON"):
        parse(arrival)
