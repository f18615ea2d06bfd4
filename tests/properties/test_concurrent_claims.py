"""Several relays claiming over the same rows at once, each thread on its own connection.

With ``SELECT … FOR UPDATE SKIP LOCKED`` (PostgreSQL, MariaDB) no row is ever held by
two claimers at once and none is left behind; with the relay's whole step, every
message is published exactly once and each key's messages go out in sequence order.
Hypothesis chooses the number of rows and keys, the threads and the batch sizes.
SQLite serialises writers and has no row locks: it is not a database several
processes claim from (``row_locks``).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from hypothesis import given, settings
from hypothesis import strategies as st

import django_outbox
from django_outbox.models import OutboxKey, OutboxMessage, OutboxState
from django_outbox.outbox.relay import Relay
from django_outbox.outbox.transports import memory

pytestmark = [
    pytest.mark.properties,
    pytest.mark.row_locks,
    pytest.mark.django_db(transaction=True),
]

KEYS = (None, "k1", "k2", "k3")
#: Each example starts threads: a tenth of the profile's examples, at least 12.
CONCURRENT_EXAMPLES = max(12, settings.default.max_examples // 10)


def start_together(count: int, work: Callable[[int], Any]) -> list[Any]:
    """Run ``work(i)`` on *count* threads released at the same moment; each thread has its
    own database connection, closed when it ends. Re-raises a thread's error."""
    gate = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            gate.wait()
            results[i] = work(i)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a claimer hung"
    if errors:
        raise errors[0]
    return results


def fill(keys: list[str | None]) -> list[OutboxMessage]:
    OutboxMessage.objects.all().delete()
    OutboxKey.objects.all().delete()
    memory.clear()
    return [django_outbox.send("prop.claimed", {"n": n}, key=key) for n, key in enumerate(keys)]


@settings(max_examples=CONCURRENT_EXAMPLES)
@given(
    keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=80),
    threads=st.integers(2, 4),
    batch=st.integers(1, 25),
)
def test_no_row_is_claimed_twice_and_none_is_left(keys, threads, batch):
    messages = fill(keys)

    def claim_until_empty(_: int) -> list[tuple[int, Any]]:
        relay = Relay(batch_size=batch)
        taken: list[tuple[int, Any]] = []
        while True:
            rows, lease = relay.claim_batch()
            if not rows:
                return taken
            taken.extend((row.pk, lease.token) for row in rows)

    claims = [pk for taken in start_together(threads, claim_until_empty) for pk, _ in taken]
    # Nobody gives anything back: a row claimed twice was held by two claimers at once.
    twice = [pk for pk, n in Counter(claims).items() if n > 1]
    assert not twice, f"claimed twice: {twice}"
    stored = dict(OutboxMessage.objects.values_list("pk", "state"))
    # Per key, only a head (with the run behind it) is claimable: the rest of a key stays
    # should_be_sent until its head is sent. Every head was taken.
    heads = {}
    for message in messages:
        slot = message.key if message.key is not None else ("alone", message.pk)
        heads.setdefault(slot, message.pk)
    assert set(heads.values()) <= set(claims), "a claimable row was left behind"
    assert set(claims) == {pk for pk, state in stored.items() if state == OutboxState.SENDING}
    leased = dict(OutboxMessage.objects.filter(pk__in=claims).values_list("pk", "lock_token"))
    assert all(leased[pk] is not None for pk in claims)


@settings(max_examples=CONCURRENT_EXAMPLES)
@given(
    keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=80),
    threads=st.integers(2, 4),
    batch=st.integers(1, 25),
)
def test_relays_racing_send_each_message_once_in_key_order(keys, threads, batch):
    messages = fill(keys)
    unsent = OutboxMessage.objects.exclude(state=OutboxState.SENT)

    def drain(_: int) -> int:
        relay = Relay(batch_size=batch)
        sent = 0
        deadline = time.monotonic() + 30
        # A key's next run is claimable only once its head is recorded, possibly by
        # another relay: keep going while anything is unsent.
        while time.monotonic() < deadline:
            result = relay.run_batch()
            sent += result.sent
            if not result.claimed and not unsent.exists():
                return sent
        return sent

    counts = start_together(threads, drain)
    published = [envelope.message_id for envelope in memory.mailbox["default"]]
    assert Counter(published) == Counter(m.message_id for m in messages), "lost or duplicated"
    assert sum(counts) == len(messages)
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {OutboxState.SENT}
    order: dict[str, list[int]] = defaultdict(list)
    for envelope in memory.mailbox["default"]:
        if envelope.key is not None:
            order[envelope.key].append(envelope.sequence)
    for key, sequences in order.items():
        assert sequences == sorted(sequences), f"key {key} published out of order: {sequences}"
