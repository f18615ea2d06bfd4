"""The lean relay woken by NOTIFY: the latency bound ``outbox_relay`` is measured against.

    python -m tests.benchmarks.lean_listen --broker redis --queue outbox-latency

``tests.benchmarks.latency`` runs it as the ``lean`` dispatch: the producers' ``send()``
queues the same NOTIFY as with ``DISPATCH = "notify"``, and this process, written
directly with psycopg and redis-py or py-amqp, does what ``outbox_relay`` does for it
and nothing more: on each notification it claims what is due (``relay.lean_claim``),
publishes it, marks it sent (``relay.lean_mark_sent``) and claims again until nothing
is due. No leases' fencing, no per-key order, no outcomes, no heartbeat: what a relay
cannot do with less.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable
from typing import Any

from django_outbox.conf import SHARED_DEFAULTS
from tests.benchmarks import relay as harness

#: The columns the Redis publisher reads from a claimed row.
REDIS_COLUMNS = "id, message_id, type, payload"


def redis_publisher(queue: str) -> tuple[Callable[[list[Any]], None], Callable[[], None]]:
    """One pipelined ``LPUSH`` a batch, each message a JSON object whose
    ``properties.message_id`` the latency harness's consumer reads (as it reads ours)."""
    import redis

    client = redis.Redis.from_url(harness.REDIS_URL)

    def publish(rows: list[Any]) -> None:
        messages = [
            {
                "body": r[3],
                "headers": {"outbox-type": r[2]},
                "properties": {"message_id": str(r[1])},
            }
            for r in rows
        ]
        client.lpush(queue, *[json.dumps(message) for message in messages])

    return publish, client.close


def listen(broker: str, queue: str, channel: str) -> None:
    """Relay what is due whenever a notification on *channel* comes (and at least every
    second), until SIGTERM."""
    import psycopg

    if broker == "redis":
        publish, close = redis_publisher(queue)
        columns = REDIS_COLUMNS
    else:
        publish, close = harness.lean_rabbit_publisher(queue, confirm=True)
        columns = harness.LEAN_RABBIT_COLUMNS
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    conn = psycopg.connect(harness.BENCH_DB)
    waiter = psycopg.connect(harness.BENCH_DB, autocommit=True)
    waiter.execute(f'LISTEN "{channel}"')
    try:
        while not stopping:
            while rows := harness.lean_claim(conn, columns):
                publish(rows)
                harness.lean_mark_sent(conn, [row[0] for row in rows])
            for _ in waiter.notifies(timeout=1.0, stop_after=1):
                pass
    finally:
        close()
        conn.close()
        waiter.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis")
    parser.add_argument("--queue", required=True)
    parser.add_argument(
        "--channel",
        default=SHARED_DEFAULTS["NOTIFY_CHANNEL"],
        help="The NOTIFY channel (the setting's default, as the harness's producers use).",
    )
    args = parser.parse_args()
    listen(args.broker, args.queue, args.channel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
