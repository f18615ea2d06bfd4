"""Tasks and a transport whose errors carry what a database refuses (a NUL)."""

from django_outbox.exceptions import PermanentError
from django_outbox.jobs.compat import task
from django_outbox.outbox.transports.base import Transport


@task(max_attempts=1)
def fails_with_nul():
    raise RuntimeError("bad byte: a\x00b")


@task()
def returns(value):
    return value


@task()
def takes_one(value):
    return None


class RefusesWithNul(Transport):
    """A destination that refuses every message with a NUL in its answer."""

    known_options = frozenset()

    def publish_one(self, envelope):
        raise PermanentError("refused: a\x00b")


@task(max_attempts=3)
def returns_nul():
    return {"text": "a\x00b"}
