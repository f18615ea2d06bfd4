"""Instructions one message costs ``inbox_consume`` and the lean consumer, counted by
valgrind: the same figure on a busy machine as on an idle one.

    python -m tests.benchmarks.inbox_instructions --messages 5000

``make bench-inbox``'s throughput ratio moves by a tenth between runs on two shared
cores; a change of a few per cent to the consumer cannot be told from that. This
counts what each consumer's Python process executes instead, in two variants:

- ``inbox_consume``: the consumer behind ``manage.py inbox_consume`` (``KombuConsumer``,
  batches of 500, each stored and handled by a no-op handler in one transaction and
  acknowledged after the commit);
- the lean consumer (``tests.benchmarks.lean_inbox``): one ``INSERT … ON CONFLICT DO
  NOTHING`` a batch, marked handled in the same transaction, one multiple ack.

Each runs in a process of its own under ``valgrind --tool=callgrind``, against the
inbox benchmark's database and RabbitMQ queue: it publishes and consumes 500 messages
to warm up, publishes ``--messages`` more, and consumes them or not; the difference
between the two counts, divided by ``--messages``, is one message's own instructions.
PostgreSQL's and RabbitMQ's work is not counted.

Needs valgrind (Debian: ``apt install valgrind``); four runs under valgrind take about
five minutes for 5,000 messages. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os

from tests.benchmarks import common
from tests.benchmarks import inbox as harness

#: The variants by the name ``--variants`` takes, with the label the table shows.
VARIANTS = {"ours": "inbox_consume", "lean": "lean consumer"}
WARM = 500
#: How long either consumer waits here to fill a batch: long enough that every batch is
#: full (the messages are all in the queue before the consumer starts).
BATCH_SECONDS = 600.0


def consume(variant: str, count: int) -> None:
    """Consume *count* messages from the benchmark's queue, as *variant* does."""
    from django.db import connection

    from django_outbox.models import InboxMessage, InboxState

    if variant == "ours":
        from django_outbox.conf import get_settings
        from django_outbox.inbox.consumers.kombu import KombuConsumer

        source = get_settings().inbox.sources["bench"]
        # Batches of 500 whatever the pace: under valgrind receiving 500 messages
        # takes longer than the 50 ms a batch waits by default, and batches cut short
        # by time made the count a draw (287k and 732k a message for the same code).
        KombuConsumer(source, batch_size=500, batch_seconds=BATCH_SECONDS).run(max_messages=count)
    else:
        from tests.benchmarks import lean_inbox

        lean_inbox.consume(
            harness.AMQP_URL, harness.QUEUE, harness.BENCH_DB, 5.0, count, BATCH_SECONDS
        )
    handled = InboxMessage.objects.filter(state=InboxState.HANDLED).count()
    connection.close()
    if handled < count:
        raise RuntimeError(f"{variant} handled {handled} of {count} messages")


def truncate() -> None:
    from django.db import connection

    from django_outbox.models import InboxCursor, InboxMessage

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {InboxMessage._meta.db_table}, {InboxCursor._meta.db_table}")


def child(variant: str, count: int, consumed: bool) -> None:
    """Warm *variant* up, then publish *count* messages and, if *consumed*, consume them."""
    harness.setup_django()
    from django_outbox.engine.loop import settle_heap

    truncate()
    harness.publish(WARM)
    consume(variant, WARM)
    truncate()
    # As inbox_consume does before its loop: what start-up loaded out of the
    # collector's sight. Both variants' processes have loaded Django.
    settle_heap()
    harness.publish(count)
    if consumed:
        consume(variant, count)


def counted(variant: str, count: int, consumed: bool, smoke: bool = False) -> int:
    """Instructions valgrind counted in a child process of *variant* (with *smoke*, the
    child runs without valgrind and 0 is returned)."""
    arguments = ["--child", variant, str(count), "consumed" if consumed else "published"]
    env = dict(os.environ, OUTBOX_SETTINGS_JSON=json.dumps(harness.SETTINGS))
    return common.instructions(
        "tests.benchmarks.inbox_instructions", arguments, harness.ROOT, env, smoke
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    common.add_counting_arguments(parser, ("VARIANT", "MESSAGES", "CONSUMED"), VARIANTS)
    args = parser.parse_args()
    if args.child:
        variant, count, consumed = args.child
        child(variant, int(count), consumed == "consumed")
        return 0
    if args.messages % 500:
        parser.error("--messages must be a multiple of 500 (the batch size)")
    return common.count_variants(
        parser,
        args,
        VARIANTS,
        counted,
        count=args.messages,
        item="message",
        title=f"{args.messages} messages a variant, RabbitMQ → PostgreSQL, batches of 500",
    )


if __name__ == "__main__":
    raise SystemExit(main())
