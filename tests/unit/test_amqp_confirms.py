"""How the RabbitMQ publisher settles publisher confirms: an ack or nack with
``multiple`` settles every pending delivery up to its tag and no further; a single one
settles its own tag only; each settles into the outcomes of the batch that handed the
message over, also while a later batch is in flight."""

from uuid import uuid4

from django_outbox.exceptions import ConnectionLostError, RetryableError
from django_outbox.outbox.transports.kombu import _AmqpPublisher, _Handed


def pending_publisher(tags, batches=None):
    """A publisher with *tags* unconfirmed; *batches* maps each tag to its batch's index
    (default: one batch)."""
    publisher = _AmqpPublisher({"url": "amqp://guest:guest@127.0.0.1:5672//"})
    handed = [_Handed(()) for _ in range(1 + max((batches or {0: 0}).values()))]
    ids = {tag: uuid4() for tag in tags}
    publisher._pending = {tag: (ids[tag], handed[(batches or {}).get(tag, 0)]) for tag in tags}
    return publisher, ids, handed


def test_a_multiple_ack_settles_every_tag_up_to_its_own_and_no_further():
    publisher, ids, (batch,) = pending_publisher([1, 2, 3, 5, 6])
    publisher._on_ack(3, True)
    assert batch.outcomes == {ids[1]: None, ids[2]: None, ids[3]: None}
    assert list(publisher._pending) == [5, 6]


def test_a_single_nack_settles_its_tag_alone_as_retryable():
    publisher, ids, (batch,) = pending_publisher([1, 2, 3])
    publisher._on_nack(2, False)
    assert list(batch.outcomes) == [ids[2]]
    assert isinstance(batch.outcomes[ids[2]], RetryableError)
    assert list(publisher._pending) == [1, 3]


def test_a_multiple_nack_after_an_ack_settles_the_rest_as_failed():
    publisher, ids, (batch,) = pending_publisher([1, 2, 3, 4])
    publisher._on_ack(2, True)
    publisher._on_nack(4, True)
    assert batch.outcomes[ids[1]] is None and batch.outcomes[ids[2]] is None
    assert all(isinstance(batch.outcomes[ids[t]], RetryableError) for t in (3, 4))
    assert publisher._pending == {}


def test_a_returned_message_is_settled_with_why_it_came_back():
    publisher, ids, (batch,) = pending_publisher([1, 2])
    publisher._returned[str(ids[1])] = "unroutable: no queue"
    publisher._on_ack(2, True)
    assert str(batch.outcomes[ids[1]]) == "unroutable: no queue"
    assert batch.outcomes[ids[2]] is None


def test_confirms_settle_into_the_batch_that_handed_each_message_over():
    publisher, ids, (first, second) = pending_publisher([1, 2, 3, 4], {1: 0, 2: 0, 3: 1, 4: 1})
    publisher._on_ack(3, True)
    assert first.outcomes == {ids[1]: None, ids[2]: None}
    assert second.outcomes == {ids[3]: None}
    assert list(publisher._pending) == [4]


def test_a_lost_connection_leaves_every_waiting_batch_uncertain_not_only_the_current():
    publisher, ids, (first, second) = pending_publisher([1, 2, 3], {1: 0, 2: 0, 3: 1})
    publisher._on_ack(1, False)
    publisher._failed(ConnectionResetError("reset by peer"), connecting=False)
    assert first.outcomes[ids[1]] is None  # confirmed before the failure: it arrived
    for batch, tag in ((first, 2), (second, 3)):
        assert isinstance(batch.outcomes[ids[tag]], ConnectionLostError)
    assert publisher._pending == {}
