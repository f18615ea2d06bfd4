"""A relay cycle's fixed cost at small batches, against the lean relay's (issue 17 §7).

    python -m tests.benchmarks.relay_cycle --cycles 3000 --messages 2 --repeat 3 [--broker rabbitmq]

At 500 commits/s a relay cycle carries 2-3 messages, so what a cycle costs whatever it
carries sets the latency on a busy machine. This makes *messages* rows due, then times
one ``Relay.run_batch()`` to Redis (or to RabbitMQ with publisher confirms) with the
thread's CPU clock (``time.thread_time``), the heartbeat running and the heap settled as
``outbox_relay`` runs it; then the same for the lean relay's claim, publish (an
``LPUSH``, or py-amqp's publishes and one wait for their confirms) and mark
(``tests.benchmarks.relay``). Inserting the rows is outside the timed section; the
wall time of a cycle is printed too. Rounds alternate ours and the lean relay's, and
the table gives the median of each round's median. With ``--phases`` the relay's main
functions are wrapped as ``make bench-relay-phases`` wraps them (about 2 µs each a
call, so the whole cycle then carries that too) and their CPU a cycle is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from tests.benchmarks import relay as harness

#: (module, class or None, function): the phases of a cycle, with ``--phases``.
PHASES: list[tuple[str, str | None, str]] = [
    ("django_outbox.engine.runner", "Runner", "claim_batch"),
    ("django_outbox.engine.lease", "ClaimStatement", "run"),
    ("django_outbox.engine.ordering", None, "claim_followers"),
    ("django_outbox.engine.heartbeat", None, "hold"),
    ("django_outbox.engine.runner", "LeaseAttempt", "start"),
    ("django_outbox.outbox.relay", "Publishing", "_publish"),
    ("django_outbox.outbox.transports.kombu", "_AmqpPublisher", "publish"),
    ("django_outbox.outbox.transports.kombu", "_AmqpPublisher", "_await_confirms"),
    ("kombu.messaging", "Producer", "publish"),
    ("django_outbox.engine.runner", "Runner", "record"),
    ("django_outbox.engine.runner", "Runner", "_report"),
    ("django_outbox.engine.lease", "FencedRows", "update"),
]

#: Destination of ``tests.benchmarks.relay.configure()`` per broker.
DESTINATIONS = {"redis": "bench-redis", "rabbitmq": "bench-rabbit"}


def make_due(count: int, destination: str) -> None:
    """*count* due messages to the Redis destination, one statement."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO django_outbox_message
                (message_id, type, destination, payload, headers, state, attempts,
                 available_at, last_error, uncertain, created_at)
            SELECT gen_random_uuid(), 'order.created', %s,
                   jsonb_build_object('order_id', g, 'total_cents', 1000 + g),
                   '{}', 'should_be_sent', 0, now(), '', false, now()
            FROM generate_series(1, %s) AS g
            """,
            [destination, count],
        )


def ours(cycles: int, messages: int, broker: str) -> tuple[list[float], list[float]]:
    """Thread CPU and wall time of each ``Relay.run_batch()`` that found *messages* due."""
    from django_outbox.engine import heartbeat
    from django_outbox.outbox.relay import Relay
    from django_outbox.outbox.transports import registry

    registry.close_all()  # a transport of an earlier round declared a queue since purged
    relay = Relay(batch_size=500)
    relay.run_batch([-1])  # connect the transport, compile the claims
    heartbeat.start(relay.part.worker_role(), relay.using)
    spent, walls = [], []
    try:
        for _ in range(cycles):
            make_due(messages, DESTINATIONS[broker])
            began, wall = time.thread_time(), time.perf_counter()
            result = relay.run_batch()
            spent.append(time.thread_time() - began)
            walls.append(time.perf_counter() - wall)
            assert result.sent == messages, result
    finally:
        heartbeat.stop()
    return spent, walls


def lean(cycles: int, messages: int, broker: str) -> tuple[list[float], list[float]]:
    """Thread CPU and wall time of each of the lean relay's claim, publish and mark of
    *messages*."""
    import psycopg

    conn = psycopg.connect(harness.BENCH_DB, autocommit=True)
    if broker == "redis":
        import redis

        client = redis.Redis.from_url(harness.REDIS_URL)
        columns = "id, message_id, type, payload"

        def publish(rows: list[Any]) -> None:
            client.lpush(
                harness.QUEUE,
                *[json.dumps({"id": str(r[1]), "type": r[2], "payload": r[3]}) for r in rows],
            )

        close = client.close
    else:
        publish, close = harness.lean_rabbit_publisher(harness.QUEUE, confirm=True)
        columns = harness.LEAN_RABBIT_COLUMNS
    spent, walls = [], []
    try:
        for _ in range(cycles):
            make_due(messages, DESTINATIONS[broker])
            began, wall = time.thread_time(), time.perf_counter()
            rows = harness.lean_claim(conn, columns)
            publish(rows)
            harness.lean_mark_sent(conn, [r[0] for r in rows])
            spent.append(time.thread_time() - began)
            walls.append(time.perf_counter() - wall)
            assert len(rows) == messages, len(rows)
    finally:
        conn.close()
        close()
    return spent, walls


def clear() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_outbox_message, django_outbox_key")
        cursor.execute("VACUUM ANALYZE django_outbox_message")
    harness.clear_redis()
    harness.purge_rabbit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=3000)
    parser.add_argument("--messages", type=int, default=2, help="messages due a cycle")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--broker", choices=sorted(DESTINATIONS), default="redis")
    parser.add_argument("--phases", action="store_true", help="also time the relay's steps")
    args = parser.parse_args()
    harness.setup_django()
    harness.configure()
    from django_outbox.engine import heartbeat
    from django_outbox.engine.loop import settle_heap
    from tests.benchmarks.jobs_phases import wrap_phases

    heartbeat.stop()
    settle_heap()
    spent, calls = wrap_phases(PHASES) if args.phases else ({}, {})
    medians: dict[str, list[tuple[float, float]]] = {"ours": [], "lean": []}
    for round_ in range(args.repeat):
        for name, run in (("ours", ours), ("lean", lean))[:: 1 if round_ % 2 == 0 else -1]:
            clear()
            if name == "lean":
                kept = dict(spent), dict(calls)
            cpu, wall = run(args.cycles, args.messages, args.broker)
            if name == "lean":  # its publishing is no phase of ours
                spent.clear(), calls.clear()
                spent.update(kept[0]), calls.update(kept[1])
            cycle = statistics.median(cpu), statistics.median(wall)
            medians[name].append(cycle)
            print(
                f"round {round_ + 1}: {name} {cycle[0] * 1e6:,.0f} µs of CPU a cycle, "
                f"{cycle[1] * 1e6:,.0f} µs of wall time",
                flush=True,
            )
    clear()
    (mine, mine_wall), (theirs, theirs_wall) = (
        (
            statistics.median(c for c, _ in medians[name]),
            statistics.median(w for _, w in medians[name]),
        )
        for name in ("ours", "lean")
    )
    publish = "LPUSH" if args.broker == "redis" else "publish with confirms"
    print(
        f"\n{args.broker}, {args.messages} message(s) a cycle, {args.cycles} cycles, medians of "
        f"{args.repeat} rounds:\n"
        f"| relay | thread CPU a cycle | wall time a cycle |\n|---|---:|---:|\n"
        f"| outbox_relay's run_batch() | {mine * 1e6:,.0f} µs | {mine_wall * 1e6:,.0f} µs |\n"
        f"| lean claim, {publish}, mark | {theirs * 1e6:,.0f} µs | {theirs_wall * 1e6:,.0f} µs |\n"
        f"ours / lean: CPU {mine / theirs:.2f}x, wall time {mine_wall / theirs_wall:.2f}x"
    )
    if args.phases:
        cycles = args.cycles * args.repeat
        print("\n| step (inclusive, mean) | µs a cycle | calls a cycle |\n|---|---:|---:|")
        for name, seconds in spent.most_common():
            print(f"| {name} | {seconds / cycles * 1e6:,.0f} | {calls[name] / cycles:.2f} |")


if __name__ == "__main__":
    main()
