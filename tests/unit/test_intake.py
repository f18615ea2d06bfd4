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


def test_a_plain_body_is_stored_as_it_was_sent_without_being_encoded_again():
    body = '{"order": "o-1",  "total": 12.5, "lines": [1, 2], "note": "Zürich \\"x\\""}'
    parsed = parse(Arrival(SOURCE, body.encode(), HEADERS))

    row, text = parsed.prepared(SOURCE.name)

    assert text == body
    assert row["payload"] == json.loads(body)


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        (b'{"total": NaN}', "not JSON-serializable"),
        (b'{"total": -Infinity}', "not JSON-serializable"),
        (b'{"total": 1e400}', "not JSON-serializable"),
        (b'{"note": "a\\u0000b"}', "NUL character"),
        (b'{"note": "\\ud800"}', "not JSON-serializable"),
        (b"null", "is None"),
    ],
    ids=["nan", "infinity", "float-overflow", "nul", "lone-surrogate", "null"],
)
def test_a_body_the_encoding_would_refuse_is_refused_as_receive_refuses_it(body, refused):
    parsed = parse(Arrival(SOURCE, body, HEADERS))
    assert parsed.text is None
    with pytest.raises(InvalidMessage, match=refused):
        parsed.prepared(SOURCE.name)


@pytest.mark.parametrize(
    ("body", "stored"),
    [
        (b'{"n": 1E5}', '{"n":100000.0}'),
        (b'{"city": "Z\\u00fcrich"}', '{"city":"Zürich"}'),
    ],
    ids=["exponent", "escape"],
)
def test_numbers_and_escapes_the_database_would_keep_otherwise_are_encoded_again(body, stored):
    parsed = parse(Arrival(SOURCE, body, HEADERS))

    _, text = parsed.prepared(SOURCE.name)

    assert parsed.text is None and text == stored
