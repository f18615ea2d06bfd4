"""How the RabbitMQ publisher settles publisher confirms: an ack or nack with
``multiple`` settles every pending delivery up to its tag and no further; a single one
settles its own tag only."""

from uuid import uuid4

from django_outbox.exceptions import RetryableError
from django_outbox.outbox.transports.kombu import _AmqpPublisher


def pending_publisher(tags):
    publisher = _AmqpPublisher({"url": "amqp://guest:guest@127.0.0.1:5672//"})
    ids = {tag: uuid4() for tag in tags}
    publisher._pending = dict(ids)
    publisher._outcomes = {}
    publisher._returned = {}
    return publisher, ids


def test_a_multiple_ack_settles_every_tag_up_to_its_own_and_no_further():
    publisher, ids = pending_publisher([1, 2, 3, 5, 6])
    publisher._on_ack(3, True)
    assert publisher._outcomes == {ids[1]: None, ids[2]: None, ids[3]: None}
    assert list(publisher._pending) == [5, 6]


def test_a_single_nack_settles_its_tag_alone_as_retryable():
    publisher, ids = pending_publisher([1, 2, 3])
    publisher._on_nack(2, False)
    assert list(publisher._outcomes) == [ids[2]]
    assert isinstance(publisher._outcomes[ids[2]], RetryableError)
    assert list(publisher._pending) == [1, 3]


def test_a_multiple_nack_after_an_ack_settles_the_rest_as_failed():
    publisher, ids = pending_publisher([1, 2, 3, 4])
    publisher._on_ack(2, True)
    publisher._on_nack(4, True)
    assert publisher._outcomes[ids[1]] is None and publisher._outcomes[ids[2]] is None
    assert all(isinstance(publisher._outcomes[ids[t]], RetryableError) for t in (3, 4))
    assert publisher._pending == {}


def test_a_returned_message_is_settled_with_why_it_came_back():
    publisher, ids = pending_publisher([1, 2])
    publisher._returned[str(ids[1])] = "unroutable: no queue"
    publisher._on_ack(2, True)
    assert str(publisher._outcomes[ids[1]]) == "unroutable: no queue"
    assert publisher._outcomes[ids[2]] is None
