"""Time-ordered ids: version 7 UUIDs whose first 48 bits are the time in milliseconds,
so that a new row's unique id lands at the end of its index, not anywhere in it."""

import time
import uuid

from django_outbox.engine.ids import uuid7


def test_an_id_is_a_version_7_uuid_of_rfc_9562():
    made = uuid7()
    assert isinstance(made, uuid.UUID)
    assert made.version == 7
    assert made.variant == uuid.RFC_4122
    assert uuid.UUID(str(made)) == made


def test_its_first_48_bits_are_the_time_it_was_made_in_milliseconds():
    before = time.time_ns() // 1_000_000
    made = uuid7()
    after = time.time_ns() // 1_000_000
    assert before <= made.int >> 80 <= after


def test_ids_made_in_later_milliseconds_sort_after_earlier_ones():
    first = uuid7()
    time.sleep(0.002)
    second = uuid7()
    assert str(first) < str(second)  # as text, as in a PostgreSQL uuid index
    assert first.bytes < second.bytes  # as bytes, as in MySQL's char(32) or binary


def test_ids_are_unique_within_one_millisecond():
    made = {uuid7() for _ in range(100_000)}
    assert len(made) == 100_000


def test_the_random_bits_vary():
    made = [uuid7().int & ((1 << 62) - 1) for _ in range(1000)]
    assert len(set(made)) == 1000
