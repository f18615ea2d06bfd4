"""The open attempts a batch writes on its worker row (``lease.IdRuns``): the text lists
exactly the ids added and not removed, consecutive integers as runs, and reads back
(``decode_ids``) as the same ids."""

import uuid

from django_outbox.engine.lease import IdRuns, decode_ids, encode_ids


def test_consecutive_ids_are_written_as_runs_whatever_order_they_came_in():
    runs = IdRuns()
    for pk in (7, 5, 6, 9, 10, 12):
        runs.add(pk)
    assert runs.text() == "5-7,9-10,12"
    assert decode_ids(runs.text()) == {"5", "6", "7", "9", "10", "12"}


def test_removed_ids_leave_the_text_and_an_empty_batch_is_false():
    runs = IdRuns()
    for pk in range(1, 501):
        runs.add(pk)
    runs.remove(range(1, 201))
    runs.remove([300])
    assert runs.text() == "201-299,301-500"
    runs.remove(range(201, 501))
    assert not runs
    assert runs.text() == ""


def test_keys_that_are_not_integers_are_listed_one_by_one():
    first, second = uuid.UUID(int=1), uuid.UUID(int=2)
    runs = IdRuns()
    runs.add(second)
    runs.add(first)
    assert runs.text() == f"{first},{second}"
    assert decode_ids(runs.text()) == {str(first), str(second)}


def test_encode_ids_keeps_a_lone_id_and_a_run_of_two():
    assert encode_ids([1, 2, 4]) == "1-2,4"
