"""Relay throughput benchmark: django-outbox next to a lean hand-written relay.

    python -m tests.benchmarks.relay --messages 100000 --repeat 3

Runs against PostgreSQL (BENCH_DATABASE_URL, default the local server's
``django_outbox_bench`` database), Redis and RabbitMQ on this machine, one
process per relay. Prints a Markdown table of medians and ratios; the targets
of issue #2 are reported as met or missed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from datetime import date
from functools import partial
from typing import Any

from tests.benchmarks import common

BENCH_DB = os.environ.get(
    "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/django_outbox_bench"
)
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
QUEUE = "outbox-bench"

os.environ["DATABASE_URL"] = BENCH_DB
# On-commit triggers go to a Redis database of the benchmark's own, purged after.
os.environ["CELERY_BROKER_URL"] = os.environ.get(
    "BENCH_CELERY_BROKER_URL", "redis://127.0.0.1:6379/11"
)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")


def ensure_database() -> None:
    common.ensure_database(BENCH_DB)


def setup_django() -> None:
    ensure_database()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def fill(count: int, destination: str, keys: int = 0) -> None:
    """Insert *count* due messages in one statement (server-side generate_series);
    with *keys*, message g has key ``order:(g % keys)`` and its sequence in that key."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_outbox_message, django_outbox_key")
        cursor.execute(
            """
            INSERT INTO django_outbox_message
                (message_id, type, destination, payload, headers, state, attempts,
                 available_at, last_error, uncertain, created_at, key, sequence)
            SELECT gen_random_uuid(), 'order.created', %s,
                   jsonb_build_object('order_id', g, 'customer', 'customer-' || (g %% 100),
                                      'total_cents', 1000 + g %% 997),
                   '{}', 'should_be_sent', 0, now(), '', false, now(),
                   CASE WHEN %s > 0 THEN 'order:' || (g %% %s) END,
                   CASE WHEN %s > 0 THEN g / %s + 1 END
            FROM generate_series(1, %s) AS g
            """,
            [destination, keys, max(keys, 1), keys, max(keys, 1), count],
        )
        cursor.execute("VACUUM ANALYZE django_outbox_message")


def clear_redis() -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    client.delete(QUEUE)
    client.close()


def flush_celery_broker() -> None:
    """Empty the benchmark's own Celery broker database (stale triggers)."""
    import redis

    client = redis.Redis.from_url(os.environ["CELERY_BROKER_URL"])
    client.flushdb()
    client.close()


def redis_length() -> int:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        return int(client.llen(QUEUE))
    finally:
        client.close()


def purge_rabbit() -> None:
    from kombu import Connection

    with Connection(AMQP_URL) as connection:
        connection.default_channel.queue_delete(QUEUE)


def run_outbox_relay(
    count: int, destination: str, label: str | None = None, waiting: int | None = None
) -> float:
    """django-outbox's relay, one process, batches of 500: messages per second (its CPU
    per message kept under *label*, default the destination's name). *waiting* sets
    ``Runner.waiting_batches`` (RabbitMQ with confirms) instead of its default."""
    from django.db import connection

    from django_outbox.outbox.relay import Relay
    from django_outbox.outbox.transports import registry

    registry.close_all()
    relay = Relay(batch_size=500)
    if waiting is not None:
        relay.waiting_batches = waiting
    relay.run_batch([-1])  # connect the transport outside the timed section
    started, cpu = time.perf_counter(), time.process_time()
    total = relay.drain(time_budget=3600)
    elapsed = time.perf_counter() - started
    CPU_PER_MESSAGE.setdefault(label or destination, []).append((time.process_time() - cpu) / count)
    assert total.sent == count, total
    connection.close()
    return count / elapsed


#: CPU seconds per message of this process (every thread) over each relay run, per
#: destination ("lean" for the lean relay): both relays run in this process, one at a
#: time, so each figure is that relay's own.
CPU_PER_MESSAGE: dict[str, list[float]] = {}


def lean_claim(conn: Any, columns: str) -> list[Any]:
    """The lean relays' claim: 500 due rows in one ``UPDATE … RETURNING`` over
    ``SKIP LOCKED``, *columns* read back."""
    with conn.transaction():
        rows: list[Any] = conn.execute(
            f"""
            UPDATE django_outbox_message
            SET state = 'sending', locked_until = now() + interval '60 seconds',
                lock_token = %s, attempts = attempts + 1
            WHERE id IN (
                SELECT id FROM django_outbox_message
                WHERE state = 'should_be_sent' AND NOT blocked AND available_at <= now()
                ORDER BY available_at, id LIMIT 500 FOR UPDATE SKIP LOCKED)
            RETURNING {columns}
            """,
            [uuid.uuid4()],
        ).fetchall()
    return rows


def lean_mark_sent(conn: Any, ids: list[Any]) -> None:
    """The lean relays' record: the batch marked sent in one statement."""
    with conn.transaction():
        conn.execute(
            """
            UPDATE django_outbox_message
            SET state = 'sent', sent_at = now(), finished_at = now(),
                locked_until = NULL, lock_token = NULL
            WHERE id = ANY(%s)
            """,
            [ids],
        )


def _timed_lean(
    label: str, count: int, publish: Callable[[list[Any]], None], columns: str
) -> float:
    """Claim, *publish*, mark sent until nothing is due: messages per second, the
    process's CPU per message kept under *label*."""
    import psycopg

    conn = psycopg.connect(BENCH_DB)
    moved = 0
    started, cpu = time.perf_counter(), time.process_time()
    while rows := lean_claim(conn, columns):
        publish(rows)
        lean_mark_sent(conn, [r[0] for r in rows])
        moved += len(rows)
    elapsed = time.perf_counter() - started
    CPU_PER_MESSAGE.setdefault(label, []).append((time.process_time() - cpu) / count)
    conn.close()
    assert moved == count, moved
    return count / elapsed


def run_lean_relay(count: int, label: str = "lean") -> float:
    """The same data movement written directly with psycopg and redis-py."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)

    def publish(rows: list[Any]) -> None:
        client.lpush(
            QUEUE,
            *[json.dumps({"id": str(r[1]), "type": r[2], "payload": r[3]}) for r in rows],
        )

    try:
        return _timed_lean(label, count, publish, "id, message_id, type, payload")
    finally:
        client.close()


def run_lean_rabbit_relay(count: int, *, confirm: bool) -> float:
    """The lean relay to RabbitMQ (``lean_rabbit_publisher``)."""
    publish, close = lean_rabbit_publisher(QUEUE, confirm=confirm)
    label = "lean-rabbit" if confirm else "lean-rabbit-unconfirmed"
    try:
        return _timed_lean(label, count, publish, LEAN_RABBIT_COLUMNS)
    finally:
        close()


#: The columns the lean RabbitMQ publisher reads from a claimed row.
LEAN_RABBIT_COLUMNS = "id, message_id, type, payload, created_at"


def lean_rabbit_publisher(
    queue: str, *, confirm: bool
) -> tuple[Callable[[list[Any]], None], Callable[[], None]]:
    """The lean relay's publishing to RabbitMQ, and how to close it: psycopg's rows
    (``LEAN_RABBIT_COLUMNS``) through py-amqp (what kombu runs on for ``amqp://``), each
    message persistent with the standard outbox headers, so the broker stores what it
    stores for ours. With *confirm*, mandatory publishes and one wait per batch for the
    broker's confirms, as ours does. kombu only opens the connection (it reads the URL);
    the messages go through py-amqp's channel."""
    channel = LeanAmqpChannel(queue, confirm=confirm)

    def publish(rows: list[Any]) -> None:
        channel.wait_for(channel.publish(rows))

    return publish, channel.close


class LeanAmqpChannel:
    """py-amqp's channel to RabbitMQ for the lean relays: :meth:`publish` hands a batch
    over and returns the delivery tag of its last message, :meth:`wait_for` waits until
    the broker has confirmed every message up to a tag (RabbitMQ confirms a channel's
    messages in order, in one multiple ack or one by one)."""

    def __init__(self, queue: str, *, confirm: bool) -> None:
        import kombu

        self.queue, self.confirm = queue, confirm
        self.connection = kombu.Connection(AMQP_URL)
        self.channel: Any = self.connection.default_channel
        self.channel.queue_declare(queue, durable=True, auto_delete=False)
        self.confirmed = 0
        self.sent = 0
        if confirm:
            self.channel.confirm_select()
            self.channel.events["basic_ack"].add(self._on_ack)

    def _on_ack(self, tag: int, multiple: bool) -> None:
        self.confirmed = max(self.confirmed, tag)

    def publish(self, rows: list[Any]) -> int:
        import amqp

        for _, message_id, type_, payload, created_at in rows:
            message_id = str(message_id)
            headers = {
                "outbox-message-id": message_id,
                "outbox-type": type_,
                "outbox-correlation-id": message_id,
                "outbox-attempt": "1",
                "outbox-created-at": created_at.isoformat(),
            }
            message = amqp.Message(
                json.dumps(payload),
                content_type="application/json",
                content_encoding="utf-8",
                delivery_mode=2,
                message_id=message_id,
                correlation_id=message_id,
                type=type_,
                application_headers=headers,
            )
            self.channel.basic_publish(
                message, exchange="", routing_key=self.queue, mandatory=self.confirm
            )
        self.sent += len(rows)
        return self.sent

    def wait_for(self, tag: int) -> None:
        while self.confirm and self.confirmed < tag:
            self.connection.drain_events(timeout=10)

    def close(self) -> None:
        self.connection.release()


#: How many batches late the pipelined lean relay awaits its confirms: as many as
#: ``outbox_relay`` keeps waiting by default (``Runner.waiting_batches``).
LEAN_CONFIRMS_LATE = 2


def run_lean_rabbit_pipelined(count: int, late: int = LEAN_CONFIRMS_LATE) -> float:
    """The lean relay to RabbitMQ with confirms awaited *late* batches late: it claims
    and publishes batch N+late, then waits for batch N's confirms and marks N sent, so
    the broker stores N while the relay works on the next ones. Nothing is marked sent
    before the broker confirmed it, as with one wait per batch."""
    import psycopg

    channel = LeanAmqpChannel(QUEUE, confirm=True)
    conn = psycopg.connect(BENCH_DB)
    moved = 0
    started, cpu = time.perf_counter(), time.process_time()
    waiting: deque[tuple[list[Any], int]] = deque()  # batches handed over, their last tag
    while True:
        rows = lean_claim(conn, LEAN_RABBIT_COLUMNS)
        if rows:
            waiting.append(([r[0] for r in rows], channel.publish(rows)))
        while len(waiting) > (late if rows else 0):
            ids, last = waiting.popleft()
            channel.wait_for(last)
            lean_mark_sent(conn, ids)
            moved += len(ids)
        if not rows:
            break
    elapsed = time.perf_counter() - started
    name = "lean-rabbit-pipelined"
    if late != LEAN_CONFIRMS_LATE:
        name += f"@{late}"
    CPU_PER_MESSAGE.setdefault(name, []).append((time.process_time() - cpu) / count)
    conn.close()
    channel.close()
    assert moved == count, moved
    return count / elapsed


def run_send_vs_bare_insert(transactions: int) -> tuple[float, float, float]:
    """Transactions per second: an order + send() (no dispatch) vs the same order + a
    bare INSERT of the same outbox row (what any durable send must at least cost), and
    the median of the rounds' ratios."""
    return alternate_rates(order_and_send, order_and_bare_insert, transactions)


#: What the least a durable send costs is measured against: the outbox row, inserted
#: with no library in between.
BARE_MESSAGE_INSERT = (
    "INSERT INTO django_outbox_message (message_id, type, destination, payload, headers, "
    "state, attempts, available_at, last_error, uncertain, created_at) VALUES "
    "(%s, %s, %s, %s, '{}', 'should_be_sent', 0, now(), '', false, now())"
)


def order_and_send(n: int) -> None:
    """A business transaction: an order and ``send()`` of its event (``configure()``)."""
    from django.db import transaction

    import django_outbox
    from testproject.shop.models import Order

    with transaction.atomic():
        order = Order.objects.create(customer=f"c{n}", total_cents=abs(n))
        django_outbox.send("order.created", {"order_id": order.pk}, to="bench-redis")


def order_and_bare_insert(n: int) -> None:
    """The same transaction with the outbox row inserted bare."""
    from django.db import connection, transaction

    from testproject.shop.models import Order

    with transaction.atomic():
        order = Order.objects.create(customer=f"c{n}", total_cents=abs(n))
        with connection.cursor() as cursor:
            cursor.execute(
                BARE_MESSAGE_INSERT,
                [uuid.uuid4(), "order.created", "bench-redis", json.dumps({"order_id": order.pk})],
            )


def alternate_rates(
    first: Callable[[int], None], second: Callable[[int], None], transactions: int
) -> tuple[float, float, float]:
    """Median rates of *first* and *second*, and the median of each round's ratio of
    *first* to *second*, in rounds that take turns (``common.rates_in_turns``)."""
    from django.db import connection

    measured = common.rates_in_turns(
        {"first": first, "second": second}, transactions, against="second"
    )
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE shop_order, django_outbox_message, django_outbox_key")
    return measured["first"][0], measured["second"][0], measured["first"][1]


def run_send_vs_delay_on_commit(transactions: int) -> tuple[float, float, float]:
    """Transactions per second: an order + send() vs an order + delay_on_commit()."""
    from celery import shared_task
    from django.db import transaction

    import django_outbox
    from testproject.shop.models import Order

    @shared_task(name="bench.noop")
    def noop(order_id: int) -> None:
        return None

    def with_send(n: int) -> None:
        with transaction.atomic():
            order = Order.objects.create(customer=f"c{n}", total_cents=abs(n))
            django_outbox.send("order.created", {"order_id": order.pk}, to="bench-redis")

    def with_delay(n: int) -> None:
        with transaction.atomic():
            order = Order.objects.create(customer=f"c{n}", total_cents=abs(n))
            noop.delay_on_commit(order.pk)

    result = alternate_rates(with_send, with_delay, transactions)
    from django_outbox.engine import triggers

    triggers.flush()
    import redis

    redis.Redis.from_url(os.environ["CELERY_BROKER_URL"]).flushdb()
    return result


def relay_peak_rss_mb(backlog: int, batches: int) -> float:
    """Peak RSS (MB) of an ``outbox_relay`` process moving *batches* batches of 500
    out of a backlog of *backlog* due rows: flat memory means this does not grow
    with the backlog."""
    import subprocess
    from pathlib import Path

    from django.conf import settings

    clear_redis()
    fill(backlog, "bench-redis")
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "DATABASE_URL": BENCH_DB,
        "OUTBOX_SETTINGS_JSON": json.dumps({**settings.DJANGO_OUTBOX, "DISPATCH": "none"}),
    }
    child = subprocess.Popen(
        [
            sys.executable,
            str(root / "manage.py"),
            "outbox_relay",
            "--batch",
            "500",
            "--max-batches",
            str(batches),
            "--no-listen",
        ],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # wait4 gives this child's own peak (kilobytes on Linux), not the maximum
    # over every child so far.
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    assert child.returncode == 0, child.returncode
    clear_redis()
    return usage.ru_maxrss / 1024


def configure(dispatch: str = "none") -> None:
    from django.conf import settings

    settings.DJANGO_OUTBOX = {
        "OUTBOX": {
            "DESTINATIONS": {
                "bench-redis": {"TRANSPORT": "kombu", "URL": REDIS_URL, "QUEUE": QUEUE},
                "bench-rabbit": {"TRANSPORT": "kombu", "URL": AMQP_URL, "QUEUE": QUEUE},
                "bench-rabbit-unconfirmed": {
                    "TRANSPORT": "kombu",
                    "URL": AMQP_URL,
                    "QUEUE": QUEUE,
                    "CONFIRM": False,
                },
            },
        },
        "DISPATCH": dispatch,
    }
    from django_outbox.conf import _reset_on_change

    _reset_on_change(setting="DJANGO_OUTBOX")


def median_of(repeat: int, prepare: Callable[[], None], measure: Callable[[], float]) -> float:
    samples = []
    for _ in range(repeat):
        prepare()
        samples.append(measure())
    return statistics.median(samples)


def report_send(transactions: int) -> int:
    """Target 6 alone: an order + send() against the order + a bare INSERT."""
    send_tps, bare_tps, ratio = run_send_vs_bare_insert(transactions)
    print(
        f"\n{date.today()} · {platform.node()} · {os.cpu_count()} cores · Python "
        f"{platform.python_version()} · {transactions:,} transactions of each, 10 rounds\n"
    )
    print("| transaction | per second (median) | of the bare INSERT (median of the rounds) |")
    print("|---|---:|---:|")
    print(f"| order + send() | {send_tps:,.0f} | {ratio:.2f} |")
    print(f"| order + bare INSERT of the outbox row | {bare_tps:,.0f} | 1.00 |")
    print(f"\n- send() transaction >= 0.90 of a bare INSERT: {'met' if ratio >= 0.9 else 'missed'}")
    return 0


def run_rabbit(n: int, repeat: int, also_late: Sequence[int] = ()) -> dict[str, float]:
    """Publisher confirms against plain publishing, ours and the lean relays', in turn:
    the median messages per second of each. With *also_late*, ours and the pipelined
    lean relay also run with that many batches waiting for their confirms (named
    ``bench-rabbit@K`` and ``lean-rabbit-pipelined@K``), in the same turns."""
    samples: dict[str, list[float]] = {}
    runs: dict[str, Callable[[], float]] = {
        "bench-rabbit": lambda: run_outbox_relay(n, "bench-rabbit"),
        "bench-rabbit-unconfirmed": lambda: run_outbox_relay(n, "bench-rabbit-unconfirmed"),
        "lean-rabbit": lambda: run_lean_rabbit_relay(n, confirm=True),
        "lean-rabbit-unconfirmed": lambda: run_lean_rabbit_relay(n, confirm=False),
        "lean-rabbit-pipelined": lambda: run_lean_rabbit_pipelined(n, LEAN_CONFIRMS_LATE),
    }
    for k in also_late:
        runs[f"bench-rabbit@{k}"] = partial(run_outbox_relay, n, "bench-rabbit", f"ours@{k}", k)
        runs[f"lean-rabbit-pipelined@{k}"] = partial(run_lean_rabbit_pipelined, n, k)
    for _ in range(repeat):
        for name, run in runs.items():
            purge_rabbit()
            destination = name.partition("@")[0]
            fill(n, destination if destination.startswith("bench") else "bench-rabbit")
            samples.setdefault(name, []).append(run())
    purge_rabbit()
    return {name: statistics.median(values) for name, values in samples.items()}


def report_rabbit(n: int, repeat: int, also_late: Sequence[int] = ()) -> int:
    """Target 2 alone: each relay to RabbitMQ, with and without confirms."""
    from django_outbox.engine.runner import Runner

    rabbit = run_rabbit(n, repeat, also_late)

    def label(name: str) -> str:
        name, _, late = name.partition("@")
        return RABBIT_LABELS[name].format(
            late=late or LEAN_CONFIRMS_LATE, waiting=late or Runner.waiting_batches
        )

    print(
        f"\n{date.today()} · {platform.node()} · {os.cpu_count()} cores · Python "
        f"{platform.python_version()} · {n:,} messages, median of {repeat}\n"
    )
    print("| relay → RabbitMQ | messages/s | of its unconfirmed | CPU a message |")
    print("|---|---:|---:|---:|")
    for name, unconfirmed in (
        ("bench-rabbit", "bench-rabbit-unconfirmed"),
        ("bench-rabbit-unconfirmed", "bench-rabbit-unconfirmed"),
        ("lean-rabbit", "lean-rabbit-unconfirmed"),
        ("lean-rabbit-pipelined", "lean-rabbit-unconfirmed"),
        ("lean-rabbit-unconfirmed", "lean-rabbit-unconfirmed"),
        *((f"bench-rabbit@{k}", "bench-rabbit-unconfirmed") for k in also_late),
        *((f"lean-rabbit-pipelined@{k}", "lean-rabbit-unconfirmed") for k in also_late),
    ):
        cpu = statistics.median(CPU_PER_MESSAGE[name.replace("bench-rabbit@", "ours@")]) * 1e6
        print(
            f"| {label(name)} | {rabbit[name]:,.0f} | "
            f"{rabbit[name] / rabbit[unconfirmed]:.2f} | {cpu:.1f} µs |"
        )
    met = rabbit["bench-rabbit"] >= 0.8 * rabbit["bench-rabbit-unconfirmed"]
    print(f"\n- rabbitmq with confirms >= 0.80 of unconfirmed: {'met' if met else 'missed'}")
    return 0


RABBIT_LABELS = {
    "bench-rabbit": "django-outbox, confirms, {waiting} waiting",
    "bench-rabbit-unconfirmed": "django-outbox, no confirms",
    "lean-rabbit": "lean, confirms (one wait a batch)",
    "lean-rabbit-pipelined": "lean, confirms awaited {late} late",
    "lean-rabbit-unconfirmed": "lean, no confirms",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--transactions", type=int, default=6000)
    parser.add_argument(
        "--peer-messages",
        type=int,
        default=10000,
        help="Messages for django-celery-outbox's relay, if installed (0 to skip).",
    )
    parser.add_argument(
        "--rss-backlogs",
        default="10000,1000000",
        help="Comma-separated backlog sizes for the relay memory measurement ('' to skip).",
    )
    parser.add_argument(
        "--informational",
        action="store_true",
        help="A reduced run (make test): say that its figures are not the real ones.",
    )
    parser.add_argument(
        "--only-send",
        action="store_true",
        help="Only the business transactions: send() against a bare INSERT of the row "
        "(--transactions of each, in ten rounds that take turns).",
    )
    parser.add_argument(
        "--only-rabbit",
        action="store_true",
        help="Only the relays to RabbitMQ (target 2): ours and the lean ones, with and "
        "without confirms, --messages each, in turns.",
    )
    parser.add_argument(
        "--also-late",
        type=lambda text: [int(k) for k in text.split(",")],
        default=[],
        help="With --only-rabbit: also run ours and the pipelined lean relay with these "
        "numbers of batches waiting for their confirms (comma-separated), in the same "
        "turns as the others.",
    )
    args = parser.parse_args()
    setup_django()
    configure()
    if args.only_send:
        return report_send(args.transactions)
    n, repeat = args.messages, args.repeat
    if args.only_rabbit:
        from django_outbox.engine.loop import settle_heap

        settle_heap()
        return report_rabbit(n, repeat, args.also_late)
    # As outbox_relay does before its loop (both relays run in this process after it).
    from django_outbox.engine.loop import settle_heap

    settle_heap()

    def prepare_redis() -> None:
        clear_redis()
        fill(n, "bench-redis")

    # Alternate the two relays so drift on a shared machine hits both alike.
    ours_samples, lean_samples = [], []
    for _ in range(repeat):
        prepare_redis()
        ours_samples.append(run_outbox_relay(n, "bench-redis"))
        assert redis_length() == n
        prepare_redis()
        lean_samples.append(run_lean_relay(n))
    ours_redis = statistics.median(ours_samples)
    lean_redis = statistics.median(lean_samples)

    rabbit = run_rabbit(n, repeat)
    ours_rabbit = rabbit["bench-rabbit"]
    unconfirmed_rabbit = rabbit["bench-rabbit-unconfirmed"]
    lean_rabbit, lean_unconfirmed = rabbit["lean-rabbit"], rabbit["lean-rabbit-unconfirmed"]
    lean_pipelined = rabbit["lean-rabbit-pipelined"]

    # Keyed messages (1,000 keys): ordering, counters and followers on the hot path.
    def prepare_keyed() -> None:
        clear_redis()
        fill(n, "bench-redis", keys=1000)

    def keyed_beside_lean() -> float:
        # The lean relay (unkeyed: it has no keys to keep) right after, for the ratio.
        rate = run_outbox_relay(n, "bench-redis", "keyed")
        prepare_redis()
        run_lean_relay(n, "lean-beside-keyed")
        return rate

    keyed_redis = median_of(repeat, prepare_keyed, keyed_beside_lean)
    clear_redis()

    send_bare_tps, bare_insert_tps, send_of_bare = run_send_vs_bare_insert(
        min(args.transactions, max(n // 10, 200))
    )

    configure(dispatch="celery")
    send_tps, delay_tps, send_of_delay = run_send_vs_delay_on_commit(
        min(args.transactions, max(n // 10, 200))
    )

    peer = None
    if args.peer_messages:
        try:
            import django_celery_outbox  # noqa: F401
        except ImportError:
            print("django-celery-outbox is not installed: peer comparison skipped")
        else:
            from tests.benchmarks.peer import measure

            peer = statistics.median(
                measure(args.peer_messages, BENCH_DB, "redis://127.0.0.1:6379/10")
                for _ in range(repeat)
            )

    rss = []
    for backlog in [int(b) for b in args.rss_backlogs.split(",") if b]:
        rss.append((backlog, relay_peak_rss_mb(backlog, batches=min(100, max(backlog // 500, 1)))))

    rows = [
        ("relay PostgreSQL → Redis, django-outbox", ours_redis, ours_redis / lean_redis, ">= 0.85"),
        ("relay PostgreSQL → Redis, lean psycopg + redis-py", lean_redis, 1.0, ""),
        *(
            [
                (
                    "relay PostgreSQL → Redis, django-celery-outbox 0.4.3 (Celery send_task)",
                    peer,
                    peer / lean_redis,
                    "",
                )
            ]
            if peer
            else []
        ),
        ("relay PostgreSQL → Redis, keyed (1,000 keys)", keyed_redis, keyed_redis / lean_redis, ""),
        (
            "relay PostgreSQL → RabbitMQ (confirms), django-outbox",
            ours_rabbit,
            ours_rabbit / unconfirmed_rabbit,
            ">= 0.80 of unconfirmed",
        ),
        ("relay PostgreSQL → RabbitMQ (no confirms), django-outbox", unconfirmed_rabbit, 1.0, ""),
        (
            "relay PostgreSQL → RabbitMQ (confirms), lean psycopg + py-amqp",
            lean_rabbit,
            lean_rabbit / lean_unconfirmed,
            "(of lean unconfirmed)",
        ),
        (
            f"relay PostgreSQL → RabbitMQ (confirms awaited {LEAN_CONFIRMS_LATE} batches late), "
            "lean",
            lean_pipelined,
            lean_pipelined / lean_unconfirmed,
            "(of lean unconfirmed)",
        ),
        (
            "relay PostgreSQL → RabbitMQ (no confirms), lean psycopg + py-amqp",
            lean_unconfirmed,
            1.0,
            "",
        ),
        (
            "transaction: order + send() (no dispatch)",
            send_bare_tps,
            send_of_bare,
            ">= 0.90 of bare INSERT (median of the rounds' ratios)",
        ),
        ("transaction: order + bare INSERT of the outbox row", bare_insert_tps, 1.0, ""),
        (
            "transaction: order + send() (on-commit task)",
            send_tps,
            send_of_delay,
            ">= 1.00 (median of the rounds' ratios)",
        ),
        ("transaction: order + delay_on_commit()", delay_tps, 1.0, ""),
    ]
    print(
        f"\n{date.today()} · {platform.node()} · {os.cpu_count()} cores · Python "
        f"{platform.python_version()} · {n} messages, median of {repeat}\n"
    )
    print("| measurement | per second | ratio | target |")
    print("|---|---:|---:|---|")
    for label, value, ratio, target in rows:
        ratio_text = f"{ratio:.2f}" if ratio is not None else "—"
        print(f"| {label} | {value:,.0f} | {ratio_text} | {target} |")
    for backlog, megabytes in rss:
        print(
            f"| relay peak RSS with {backlog:,} pending rows (MB) | {megabytes:,.0f} | — | < 150 |"
        )
    if peer:
        print(f"\ndjango-outbox relay / django-celery-outbox relay: {ours_redis / peer:.1f}x")
    cpu = {name: statistics.median(values) for name, values in CPU_PER_MESSAGE.items()}

    def cpu_ratio(name: str, lean: str) -> float:
        """*name*'s CPU per message over *lean*'s: the median of the ratios of the runs
        made side by side (the machine's speed drifts between rounds far more than
        within one), or the ratio of the medians when they were not paired."""
        ours, theirs = CPU_PER_MESSAGE[name], CPU_PER_MESSAGE[lean]
        if len(ours) != len(theirs):
            return cpu[name] / cpu[lean]
        return statistics.median(o / t for o, t in zip(ours, theirs, strict=True))

    print("\n| relay, one process | CPU per message | of its lean relay's |")
    print("|---|---:|---:|")
    for name, label, lean in (
        ("lean", "lean psycopg + redis-py → Redis", "lean"),
        ("bench-redis", "django-outbox → Redis", "lean"),
        ("keyed", "django-outbox → Redis, keyed (1,000 keys)", "lean-beside-keyed"),
        ("lean-rabbit", "lean psycopg + py-amqp → RabbitMQ (confirms)", "lean-rabbit"),
        ("bench-rabbit", "django-outbox → RabbitMQ (confirms)", "lean-rabbit"),
        (
            "lean-rabbit-pipelined",
            f"lean psycopg + py-amqp → RabbitMQ (confirms awaited {LEAN_CONFIRMS_LATE} "
            "batches late)",
            "lean-rabbit",
        ),
        (
            "lean-rabbit-unconfirmed",
            "lean psycopg + py-amqp → RabbitMQ (no confirms)",
            "lean-rabbit-unconfirmed",
        ),
        (
            "bench-rabbit-unconfirmed",
            "django-outbox → RabbitMQ (no confirms)",
            "lean-rabbit-unconfirmed",
        ),
    ):
        if name in cpu:
            print(f"| {label} | {cpu[name] * 1e6:.1f} µs | {cpu_ratio(name, lean):.2f} |")
    print(
        f"\nRabbitMQ, confirms against none: django-outbox {ours_rabbit / unconfirmed_rabbit:.2f}, "
        f"the lean relay {lean_rabbit / lean_unconfirmed:.2f}; with confirms, django-outbox "
        f"against the lean relay: {ours_rabbit / lean_rabbit:.2f}; the lean relay awaiting "
        f"each batch's confirms {LEAN_CONFIRMS_LATE} batches late: "
        f"{lean_pipelined / lean_unconfirmed:.2f} of its unconfirmed"
    )
    unkeyed = cpu_ratio("bench-redis", "lean")
    print(
        f"\nCPU per message PostgreSQL → Redis, unkeyed: django-outbox "
        f"{cpu['bench-redis'] * 1e6:.1f} µs, the lean relay {cpu['lean'] * 1e6:.1f} µs "
        f"({unkeyed:.2f}x, the median of the rounds' ratios; target ≤ 2x)"
    )
    checks = {
        "redis relay >= 0.85 of lean": ours_redis >= 0.85 * lean_redis,
        "redis relay CPU per message <= 2x the lean relay's": unkeyed <= 2,
        "rabbitmq with confirms >= 0.80 of unconfirmed": ours_rabbit >= 0.8 * unconfirmed_rabbit,
        "(proposed) rabbitmq with confirms >= 0.80 of the lean relay with confirms": (
            ours_rabbit >= 0.8 * lean_rabbit
        ),
        "send() transaction >= 0.90 of a bare INSERT": send_of_bare >= 0.9,
        "send() transaction >= delay_on_commit transaction": send_of_delay >= 1.0,
    }
    if rss:
        checks["relay RSS < 150 MB at every backlog"] = all(mb < 150 for _, mb in rss)
    print()
    if args.informational:
        print(
            "Reduced run (make test): figures are informational, never asserted, and too "
            "small to compare with the targets; the real figures come from `make bench` "
            "(docs/benchmarks.md)."
        )
    for name, met in checks.items():
        print(f"- {name}: {'met' if met else 'missed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
