"""Reading a delivery: which content types are read as JSON (docs/inbox.md, "Bad input
is kept, not dropped")."""

import json

import pytest

from django_outbox.conf import Source
from django_outbox.exceptions import InvalidMessage
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


def test_a_parsed_payload_is_prepared_as_it_was_read_and_checked_all_the_same():
    """``Parsed.prepared`` stores what ``json.loads`` made of the body, not a second
    decoding of its text: equal values, and what cannot be stored is still refused."""
    parsed = parse(Arrival(SOURCE, b'{"total": 5.0, "items": [1, -0.0, "\\u00e9"]}', HEADERS))

    row, text = parsed.prepared(SOURCE.name)

    assert row["payload"] is parsed.payload
    assert json.loads(text) == row["payload"] == {"total": 5.0, "items": [1, -0.0, "é"]}
    not_finite = parse(Arrival(SOURCE, b'{"total": NaN}', HEADERS))
    with pytest.raises(InvalidMessage, match="not JSON-serializable"):
        not_finite.prepared(SOURCE.name)
    with_nul = parse(Arrival(SOURCE, b'{"note": "a\\u0000b"}', HEADERS))
    with pytest.raises(InvalidMessage, match="NUL character"):
        with_nul.prepared(SOURCE.name)
