"""Where the relay's CPU goes, phase by phase (``make bench-relay-phases``).

    python -m tests.benchmarks.relay_phases --messages 50000 --repeat 3

Runs the relay benchmark's drain to Redis (``tests.benchmarks.relay``: one relay in
this process, batches of 500) with the engine's, the outbox's and the Redis
transport's main functions wrapped to add up the CPU time of the thread that calls
them (``time.thread_time``, inclusive of what they call), as
``tests.benchmarks.jobs_phases`` does for the jobs; the lean relay runs after each
round, unwrapped, for the ratio. The table is per message, summed over the rounds.
Each wrapped call adds about 2 µs: the per-message rows (the envelope, the Redis
text) carry that much each, and the whole relay's figure carries them too.
"""

from __future__ import annotations

import argparse
import statistics

from tests.benchmarks import relay as harness
from tests.benchmarks.jobs_phases import wrap_phases

#: (module, class or None, function): the phases measured.
PHASES: list[tuple[str, str | None, str]] = [
    ("django_outbox.engine.runner", "Runner", "_run"),
    ("django_outbox.engine.runner", "Runner", "claim_batch"),
    ("django_outbox.engine.lease", "ClaimStatement", "run"),
    ("psycopg", "Cursor", "fetchall"),
    ("django_outbox.outbox.relay", "Publishing", "_publish"),
    ("django_outbox.outbox.envelope", "Envelope", "from_message"),
    ("django_outbox.outbox.transports.kombu", "_RedisPublisher", "publish"),
    ("django_outbox.outbox.transports.kombu", "_RedisPublisher", "encode"),
    ("redis.client", "Redis", "execute_command"),
    ("django_outbox.engine.runner", "LeaseAttempt", "start"),
    ("django_outbox.engine.runner", "Runner", "record"),
    ("django_outbox.engine.runner", "Runner", "_report"),
    ("django_outbox.engine.transitions", None, "apply"),
    ("django_outbox.engine.lease", "FencedRows", "update"),
    ("django_outbox.engine.telemetry", None, "recorded"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n = args.messages
    harness.setup_django()
    harness.configure()
    from django_outbox.engine.loop import settle_heap

    settle_heap()
    # The lean relay is psycopg and redis-py alone: of the wrapped functions it calls
    # only redis-py's execute_command, once a batch (a 2 µs wrapper per 500 messages).
    spent, calls = wrap_phases(PHASES)
    ratios = []
    for _ in range(args.repeat):
        harness.clear_redis()
        harness.fill(n, "bench-redis")
        harness.run_outbox_relay(n, "bench-redis")
        ours = harness.CPU_PER_MESSAGE["bench-redis"][-1]
        kept = dict(spent), dict(calls)
        harness.clear_redis()
        harness.fill(n, "bench-redis")
        harness.run_lean_relay(n)
        # The lean relay's LPUSHes went through a wrapped function: not ours to count.
        spent.clear(), calls.clear()
        spent.update(kept[0]), calls.update(kept[1])
        lean = harness.CPU_PER_MESSAGE["lean"][-1]
        ratios.append(ours / lean)
        print(
            f"relay {ours * 1e6:.1f} µs a message, lean relay {lean * 1e6:.1f} µs: "
            f"{ours / lean:.2f}x"
        )
    harness.clear_redis()
    total = n * args.repeat
    print(f"\nmedian {statistics.median(ratios):.2f}x (wrappers included)\n")
    print("| phase (inclusive) | µs a message | calls |")
    print("|---|---:|---:|")
    for name, seconds in sorted(spent.items(), key=lambda item: -item[1]):
        print(f"| `{name}` | {seconds / total * 1e6:.1f} | {calls[name]} |")


if __name__ == "__main__":
    main()
