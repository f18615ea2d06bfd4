"""What one Celery trigger costs the process that commits: CPU and broker connections.

    python -m tests.benchmarks.trigger_cost --triggers 3000 --repeat 3

Publishes *triggers* on-commit triggers of the outbox (``dispatch_now``, what the
background dispatcher thread calls) to the benchmark's Celery broker (Redis), and reports
the thread's CPU and the wall time per trigger, and the connections the Redis server
accepted per trigger (``INFO stats``). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from tests.benchmarks import relay as harness


def measure(triggers: int) -> tuple[float, float, float]:
    """CPU µs, wall µs and new broker connections per trigger, over *triggers* triggers."""
    import redis

    from django_outbox.engine import triggers as dispatch

    client = redis.Redis.from_url(os.environ["CELERY_BROKER_URL"])
    dispatch.dispatch_now("outbox", "default", [0])  # the first connects and declares
    accepted = int(client.info("stats")["total_connections_received"])
    cpu, wall = time.thread_time(), time.perf_counter()
    for n in range(triggers):
        dispatch.dispatch_now("outbox", "default", [n])
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    opened = int(client.info("stats")["total_connections_received"]) - accepted
    client.flushdb()
    return cpu / triggers * 1e6, wall / triggers * 1e6, opened / triggers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--triggers", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    harness.setup_django()
    harness.configure("celery")
    import testproject  # noqa: F401  (the Celery app the triggers go through)

    rounds = [measure(args.triggers) for _ in range(args.repeat)]
    cpu = statistics.median(r[0] for r in rounds)
    wall = statistics.median(r[1] for r in rounds)
    opened = statistics.median(r[2] for r in rounds)
    print(
        f"{args.triggers} triggers, median of {args.repeat}: {cpu:.0f} µs CPU and {wall:.0f} µs "
        f"wall a trigger, {opened:.2f} new broker connections a trigger"
    )


if __name__ == "__main__":
    main()
