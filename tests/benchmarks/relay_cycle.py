"""A relay cycle's fixed cost at small batches, against the lean relay's (issue 17 §7).

    python -m tests.benchmarks.relay_cycle --cycles 3000 --messages 2 --repeat 3

At 500 commits/s a relay cycle carries 2-3 messages, so what a cycle costs whatever it
carries sets the latency on a busy machine. This makes *messages* rows due, then times
one ``Relay.run_batch()`` to Redis with the thread's CPU clock (``time.thread_time``),
the heartbeat running and the heap settled as ``outbox_relay`` runs it; then the same
for the lean relay's claim, ``LPUSH`` and mark (``tests.benchmarks.relay``). Inserting
the rows is outside the timed section. Rounds alternate ours and the lean relay's, and
the table gives the median of each round's median. With ``--phases`` the relay's main
functions are wrapped as ``make bench-relay-phases`` wraps them (about 2 µs each a
call, so the whole cycle then carries that too) and their CPU a cycle is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from tests.benchmarks import relay as harness

#: (module, class or None, function): the phases of a cycle, with ``--phases``.
PHASES: list[tuple[str, str | None, str]] = [
    ("django_outbox.engine.runner", "Runner", "claim_batch"),
    ("django_outbox.engine.lease", "ClaimStatement", "run"),
    ("django_outbox.engine.ordering", None, "claim_followers"),
    ("django_outbox.engine.heartbeat", None, "hold"),
    ("django_outbox.engine.runner", "LeaseAttempt", "start"),
    ("django_outbox.outbox.relay", "Publishing", "_publish"),
    ("django_outbox.engine.runner", "Runner", "record"),
    ("django_outbox.engine.runner", "Runner", "_report"),
    ("django_outbox.engine.lease", "FencedRows", "update"),
]

DESTINATION = "bench-redis"


def make_due(count: int) -> None:
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
            [DESTINATION, count],
        )


def ours(cycles: int, messages: int) -> list[float]:
    """Thread CPU of each ``Relay.run_batch()`` that found *messages* due."""
    from django_outbox.engine import heartbeat
    from django_outbox.outbox.relay import Relay

    relay = Relay(batch_size=500)
    relay.run_batch([-1])  # connect the transport, compile the claims
    heartbeat.start(relay.part.worker_role(), relay.using)
    spent = []
    try:
        for _ in range(cycles):
            make_due(messages)
            began = time.thread_time()
            result = relay.run_batch()
            spent.append(time.thread_time() - began)
            assert result.sent == messages, result
    finally:
        heartbeat.stop()
    return spent


def lean(cycles: int, messages: int) -> list[float]:
    """Thread CPU of each of the lean relay's claim, ``LPUSH`` and mark of *messages*."""
    import psycopg
    import redis

    conn = psycopg.connect(harness.BENCH_DB, autocommit=True)
    client = redis.Redis.from_url(harness.REDIS_URL)
    spent = []
    try:
        for _ in range(cycles):
            make_due(messages)
            began = time.thread_time()
            rows = harness.lean_claim(conn, "id, message_id, type, payload")
            client.lpush(
                harness.QUEUE,
                *[json.dumps({"id": str(r[1]), "type": r[2], "payload": r[3]}) for r in rows],
            )
            harness.lean_mark_sent(conn, [r[0] for r in rows])
            spent.append(time.thread_time() - began)
            assert len(rows) == messages, len(rows)
    finally:
        conn.close()
        client.close()
    return spent


def clear() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_outbox_message, django_outbox_key")
        cursor.execute("VACUUM ANALYZE django_outbox_message")
    harness.clear_redis()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=3000)
    parser.add_argument("--messages", type=int, default=2, help="messages due a cycle")
    parser.add_argument("--repeat", type=int, default=3)
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
    medians: dict[str, list[float]] = {"ours": [], "lean": []}
    for round_ in range(args.repeat):
        for name, run in (("ours", ours), ("lean", lean))[:: 1 if round_ % 2 == 0 else -1]:
            clear()
            if name == "lean":
                kept = dict(spent), dict(calls)
            cycle = statistics.median(run(args.cycles, args.messages))
            if name == "lean":  # its LPUSH is no phase of ours
                spent.clear(), calls.clear()
                spent.update(kept[0]), calls.update(kept[1])
            medians[name].append(cycle)
            print(f"round {round_ + 1}: {name} {cycle * 1e6:,.0f} µs a cycle", flush=True)
    clear()
    mine, theirs = (statistics.median(medians[name]) for name in ("ours", "lean"))
    print(
        f"\n{args.messages} message(s) a cycle, {args.cycles} cycles, medians of "
        f"{args.repeat} rounds:\n"
        f"| relay | thread CPU a cycle |\n|---|---:|\n"
        f"| outbox_relay's run_batch() | {mine * 1e6:,.0f} µs |\n"
        f"| lean claim, LPUSH, mark | {theirs * 1e6:,.0f} µs |\n"
        f"ours / lean: {mine / theirs:.2f}x"
    )
    if args.phases:
        cycles = args.cycles * args.repeat
        print("\n| step (inclusive, mean) | µs a cycle | calls a cycle |\n|---|---:|---:|")
        for name, seconds in spent.most_common():
            print(f"| {name} | {seconds / cycles * 1e6:,.0f} | {calls[name] / cycles:.2f} |")


if __name__ == "__main__":
    main()
