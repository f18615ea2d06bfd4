"""Order per key: only the head of a key is claimable; its followers ride along.

Rows that share a key (for the outbox: destination and ``key``) carry
increasing sequence numbers. A row may be claimed only when no earlier row
of its key is still blocking (ready, running or dead-lettered); the rows
right behind a claimed head are then taken in the same batch as one
unbroken run, so a key moves a batch at a time, not a row at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections, models
from django.db.models import BooleanField, Case, Exists, F, OuterRef, Q, Value, When

from django_outbox.engine.lease import Lease, claim
from django_outbox.engine.part import KeyOrdering

if TYPE_CHECKING:
    from django_outbox.engine.runner import Runner


def heads_only(queryset: models.QuerySet[Any], ordering: KeyOrdering) -> models.QuerySet[Any]:
    """*queryset* without rows that have an earlier blocking row of their key."""
    key_fields = ordering.key_fields
    sequence = ordering.sequence_field
    earlier = queryset.model._default_manager.filter(
        ordering.holding(),
        **{name: OuterRef(name) for name in key_fields},
        **{f"{sequence}__lt": OuterRef(sequence)},
    )
    unkeyed = Q(**{f"{key_fields[-1]}__isnull": True})
    return queryset.filter(unkeyed | ~Exists(earlier))


def claim_followers(runner: Runner, heads: Sequence[Any], lease: Lease, room: int) -> list[Any]:
    """Claim the due rows right behind the keyed *heads* this runner holds.

    No other runner can claim them: their earlier row (our head) is running,
    so they fail every other claimer's ``heads_only`` test.
    """
    part = runner.part
    ordering = part.ordering
    assert ordering is not None
    key_fields, sequence = ordering.key_fields, ordering.sequence_field
    life = part.lifecycle

    def slot_of(row: Any) -> tuple[Any, ...]:
        return tuple(getattr(row, name) for name in key_fields)

    tails: dict[tuple[Any, ...], int] = {}
    for row in heads:
        if getattr(row, key_fields[-1]) is not None:
            tails[slot_of(row)] = getattr(row, sequence)
    if not tails:
        return []
    behind = Q()
    for slot, last in tails.items():
        behind |= Q(**dict(zip(key_fields, slot, strict=True)), **{f"{sequence}__gt": last})
    manager = part.model._default_manager.using(runner.using)
    # Whether each is due is decided by the database's clock, in the same query.
    candidates = (
        manager.filter(behind, ordering.holding())
        .annotate(
            is_due=Case(
                When(available_at__lte=part.now(), then=Value(True)),
                default=Value(False),
                output_field=BooleanField(),
            )
        )
        .order_by(*key_fields, sequence)
        .only("pk", *key_fields, sequence, "state", *part.scope_fields)[: room * 4]
    )
    chosen: list[Any] = []
    chosen_slots: list[tuple[Any, tuple[Any, ...]]] = []
    blocked: set[tuple[Any, ...]] = set()
    for row in candidates:
        slot = slot_of(row)
        if slot in blocked:
            continue
        if row.state != life.ready or not row.is_due or not part.takes(row):
            # Not due, not ready, or for other workers (a job of another queue): the
            # rest of its key waits for it.
            blocked.add(slot)
            continue
        chosen.append(row.pk)
        chosen_slots.append((row.pk, slot))
        if len(chosen) >= room:
            break
    if not chosen:
        return []
    got = claim(
        manager.filter(pk__in=chosen, state=life.ready),
        lease=lease,
        limit=room,
        running_state=runner.running,
        fields=part.claimed_fields,
        now=part.now(),
    )
    # SKIP LOCKED may pass over a follower another claimer's scan has locked
    # for a moment (InnoDB locks every row a locking read scans). Keep, per
    # key, only the unbroken run behind the head; the rest goes straight
    # back, unattempted, to be claimed in order later.
    taken = {row.pk for row in got}
    keep: set[Any] = set()
    broken: set[tuple[Any, ...]] = set()
    for pk, slot in chosen_slots:
        if pk in taken and slot not in broken:
            keep.add(pk)
        else:
            broken.add(slot)
    extra = [row for row in got if row.pk not in keep]
    if extra:
        # Kept for later if the database fails now: never dropped while claimed.
        runner.release_or_keep(extra, lease)
    return [row for row in got if row.pk in keep]


#: Keys per statement when parking or releasing keys (bounded statements).
KEYS_PER_STATEMENT = 200


def _slots(ordering: KeyOrdering, rows: Sequence[Any]) -> dict[tuple[Any, ...], Any]:
    """Key of each keyed row in *rows* → its sequence."""
    slots: dict[tuple[Any, ...], Any] = {}
    for row in rows:
        slot = tuple(getattr(row, name) for name in ordering.key_fields)
        if slot[-1] is not None:
            slots[slot] = getattr(row, ordering.sequence_field)
    return slots


def block(part: Any, failed: Sequence[Any]) -> int:
    """Park the ready rows behind each failed keyed row, and mark their keys so rows
    sent later park too. Returns how many rows were parked.

    The counter is updated first: it waits for any sender of the key still in
    its transaction, so the rows it adds are there when the rows are parked.
    """
    ordering: KeyOrdering = part.ordering
    slots = list(_slots(ordering, failed).items())
    parked = 0
    manager = part.model._default_manager.using(part.using)
    counters = ordering.counter._default_manager.using(part.using)
    for start in range(0, len(slots), KEYS_PER_STATEMENT):
        chunk = slots[start : start + KEYS_PER_STATEMENT]
        behind, counter_keys = Q(), Q()
        for slot, sequence in chunk:
            match = dict(zip(ordering.key_fields, slot, strict=True))
            counter_keys |= Q(**ordering.counter_key(slot))
            behind |= Q(**match, **{f"{ordering.sequence_field}__gt": sequence})
        counters.filter(counter_keys).update(blocked=True)
        # Running ones too: followers claimed with the head go back unattempted.
        life = part.lifecycle
        parked += manager.filter(
            behind, state__in=(life.ready, life.running), blocked=False
        ).update(blocked=True)
    return parked


def unblock(part: Any, heads: Sequence[Any]) -> int:
    """Release the rows parked behind *heads* (finished or cancelled) and their keys."""
    ordering: KeyOrdering = part.ordering
    slots = list(_slots(ordering, heads))
    released = 0
    manager = part.model._default_manager.using(part.using)
    counters = ordering.counter._default_manager.using(part.using)
    for start in range(0, len(slots), KEYS_PER_STATEMENT):
        keys, counter_keys = Q(), Q()
        for slot in slots[start : start + KEYS_PER_STATEMENT]:
            keys |= Q(**dict(zip(ordering.key_fields, slot, strict=True)))
            counter_keys |= Q(**ordering.counter_key(slot))
        counters.filter(counter_keys, blocked=True).update(blocked=False)
        released += manager.filter(keys, blocked=True).update(blocked=False)
        # Another failed row of a key may still hold it back (a later failed row
        # cancelled while an earlier one waits): the key parks again behind it.
        holding = Q(blocking=True)
        if not ordering.flag_blocks:
            holding &= Q(state__in=ordering.blocking_states)
        still = list(  # the first holder of each key last: block() parks behind it
            manager.filter(keys, holding)
            .only(*ordering.key_fields, ordering.sequence_field)
            .order_by(f"-{ordering.sequence_field}")
        )
        if still:
            released -= block(part, still)
    return released


def next_sequence(db: str, counter: type[models.Model], key: dict[str, Any]) -> tuple[int, bool]:
    """Take the next sequence number of *key* (counter field → value) from *counter*, and
    whether the key is parked (a failed row holds it back: the new one parks behind it).

    One statement on PostgreSQL and SQLite (an upsert returning the new value); the
    counter row stays locked until the caller's transaction ends, so a concurrent
    writer of the same key waits: sequence order is commit order.
    """
    connection = connections[db]
    q = connection.ops.quote_name
    table, last, blocked = q(counter._meta.db_table), q("last_sequence"), q("blocked")
    names = [q(str(counter._meta.get_field(name).column)) for name in key]  # type: ignore[union-attr]
    values = list(key.values())
    columns = ", ".join(names)
    marks = ", ".join(["%s"] * len(values))
    if connection.features.can_return_columns_from_insert and connection.vendor in (
        "postgresql",
        "sqlite",
    ):
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} ({columns}, {last}, {blocked}) VALUES ({marks}, 1, %s) "
                f"ON CONFLICT ({columns}) DO UPDATE SET {last} = {table}.{last} + 1 "
                f"RETURNING {last}, {blocked}",
                [*values, False],
            )
            sequence, parked = cursor.fetchone()
            return int(sequence), bool(parked)
    if connection.vendor == "mysql":
        where = " AND ".join(f"{name} = %s" for name in names)
        with connection.cursor() as cursor:
            # The upsert locks the counter row until commit; the SELECT in the
            # same transaction reads the value this transaction wrote.
            cursor.execute(
                f"INSERT INTO {table} ({columns}, {last}, {blocked}) VALUES ({marks}, 1, %s) "
                f"ON DUPLICATE KEY UPDATE {last} = {last} + 1",
                [*values, False],
            )
            cursor.execute(f"SELECT {last}, {blocked} FROM {table} WHERE {where}", values)
            sequence, parked = cursor.fetchone()
            return int(sequence), bool(parked)
    counters = counter._default_manager.using(db)
    row, created = counters.select_for_update().get_or_create(**key, defaults={"last_sequence": 1})
    if created:
        return 1, False
    counters.filter(pk=row.pk).update(last_sequence=F("last_sequence") + 1)
    return int(row.last_sequence) + 1, bool(row.blocked)  # type: ignore[attr-defined]
