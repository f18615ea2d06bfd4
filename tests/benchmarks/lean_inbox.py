"""The lean bound of an inbox consumer, written directly with kombu and psycopg.

    python -m tests.benchmarks.lean_inbox AMQP_URL QUEUE DSN IDLE

What any deduplicating consumer must at least do per batch, and nothing more: take up to
500 messages (prefetch 1,000), parse each body as JSON, insert them all with one
``INSERT … SELECT FROM unnest(…) ON CONFLICT DO NOTHING``, mark the inserted rows
handled (a no-op handler) in the same transaction, commit, then acknowledge the batch
with one ``multiple`` ack. No framework, no model instances, no per-message statement,
no savepoint per handler, no ordering, no leases.

It exits after IDLE seconds without a message.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import kombu
import psycopg

INSERT = """
INSERT INTO django_outbox_inbox
    (source, message_id, type, payload, headers, state, attempts, available_at,
     attempt_open, unclean_end, last_error, received_at, raw_body, traceback)
SELECT 'bench', m.id, m.type, m.payload, '{}', 'should_be_handled', 0, now(),
       false, false, '', now(), '', ''
FROM unnest(%(ids)s::text[], %(types)s::text[], %(payloads)s::jsonb[]) AS m(id, type, payload)
ON CONFLICT (source, message_id) DO NOTHING
RETURNING id
"""

HANDLED = """
UPDATE django_outbox_inbox
SET state = 'handled', handled_at = clock_timestamp(), attempted_at = now(), attempts = 1
WHERE id = ANY(%(ids)s)
"""


def consume(
    url: str,
    queue: str,
    dsn: str,
    idle: float,
    max_messages: int | None = None,
    batch_wait: float = 0.05,
) -> int:
    """Consume *queue* until IDLE seconds pass without a message, or *max_messages* are
    handled; returns how many were handled. A batch is stored when it holds 500
    messages, or when none came for *batch_wait* seconds."""
    db = psycopg.connect(dsn)
    pending: list[Any] = []
    handled = 0

    def flush() -> None:
        ids, types, payloads = [], [], []
        for message in pending:
            headers = message.headers
            ids.append(headers["outbox-message-id"])
            types.append(headers["outbox-type"])
            payloads.append(json.dumps(json.loads(message.body)))
        with db.transaction():
            inserted = db.execute(
                INSERT, {"ids": ids, "types": types, "payloads": payloads}
            ).fetchall()
            db.execute(HANDLED, {"ids": [row[0] for row in inserted]})
        last = pending[-1]
        last.channel.basic_ack(last.delivery_tag, multiple=True)
        pending.clear()

    with db, kombu.Connection(url) as conn:
        consumer = conn.Consumer(
            [kombu.Queue(queue, durable=True)],
            on_message=pending.append,
            prefetch_count=1000,
        )
        with consumer:
            waited = 0.0
            while max_messages is None or handled < max_messages:
                try:
                    conn.drain_events(timeout=batch_wait)
                    waited = 0.0
                    if len(pending) < 500:
                        continue
                except TimeoutError:
                    waited += batch_wait
                    if not pending and waited >= idle:
                        break
                if pending:
                    handled += len(pending)
                    flush()
    return handled


def main() -> None:
    url, queue, dsn, idle = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    consume(url, queue, dsn, idle)


if __name__ == "__main__":
    main()
