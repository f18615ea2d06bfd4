"""Instructions one business transaction costs with ``send()`` or ``enqueue()`` against
the same transaction with a bare ``INSERT`` of the row, counted by valgrind: the same
figure on a busy machine as on an idle one.

    python -m tests.benchmarks.send_instructions --transactions 2000

Target 6 compares transactions per second: an order and ``send()`` (or ``enqueue()``)
against an order and a bare ``INSERT`` of the outbox (or job) row, the bodies of
``tests.benchmarks.relay`` and ``tests.benchmarks.jobs``. On two shared cores that ratio
moves by a tenth between runs, and a commit's wait accounts for most of a
transaction's time. This counts what the calling process executes instead: each
variant runs in a process of its own under ``valgrind --tool=callgrind`` against the
relay benchmark's database, warms up with 200 transactions, then runs
``--transactions`` more or none; the difference between the two counts, divided by
``--transactions``, is one transaction's own instructions. PostgreSQL's work is not
counted.

Needs valgrind (Debian: ``apt install valgrind``). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path

from tests.benchmarks import common, relay

ROOT = Path(__file__).resolve().parents[2]

#: The variants by the name ``--variants`` takes, with the label the table shows.
VARIANTS = {
    "send": "order + send()",
    "bare-message": "order + bare INSERT of the outbox row",
    "enqueue": "order + enqueue()",
    "bare-job": "order + bare INSERT of the job row",
}
#: Each library call's variant, with the bare one it is compared with.
PAIRS = {"send": "bare-message", "enqueue": "bare-job"}
WARM = 200


def bodies() -> dict[str, Callable[[int], None]]:
    # Imported here: tests.benchmarks.jobs points DATABASE_URL at its own database on
    # import, and this harness uses the relay's.
    from tests.benchmarks import jobs

    return {
        "send": relay.order_and_send,
        "bare-message": relay.order_and_bare_insert,
        "enqueue": jobs.order_and_enqueue,
        "bare-job": jobs.order_and_bare_insert,
    }


def child(variant: str, count: int, worked: bool) -> None:
    """Warm *variant* up, then run *count* transactions of it if *worked*."""
    import os

    body = bodies()[variant]
    os.environ["DATABASE_URL"] = relay.BENCH_DB  # after bodies(): see there
    relay.setup_django()
    relay.configure()
    from django.db import connection

    from django_outbox.engine.loop import settle_heap

    for n in range(WARM):
        body(n)
    settle_heap()
    if worked:
        for n in range(count):
            body(n)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE shop_order, django_outbox_message, django_outbox_job")


def counted(variant: str, count: int, worked: bool, smoke: bool = False) -> int:
    """Instructions valgrind counted in a child process of *variant* (with *smoke*, the
    child runs without valgrind and 0 is returned)."""
    arguments = ["--child", variant, str(count), "worked" if worked else "warmed"]
    return common.instructions("tests.benchmarks.send_instructions", arguments, ROOT, None, smoke)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=2000)
    common.add_counting_arguments(parser, ("VARIANT", "TRANSACTIONS", "WORKED"), VARIANTS)
    args = parser.parse_args()
    if args.child:
        variant, count, worked = args.child
        child(variant, int(count), worked == "worked")
        return 0
    if common.valgrind_missing(args.smoke):
        return 2
    chosen = [name.strip() for name in args.variants.split(",") if name.strip()]
    if set(chosen) - set(VARIANTS) or not chosen:
        parser.error(f"--variants takes {', '.join(VARIANTS)}; got {args.variants!r}")
    count = args.transactions
    per_transaction = {}
    for variant in chosen:
        warmed, worked = (counted(variant, count, run, args.smoke) for run in (False, True))
        per_transaction[variant] = (worked - warmed) / count
    if args.smoke:
        print(f"smoke run: {', '.join(chosen)}, {count} transactions each, without valgrind")
        return 0
    print(
        f"\n{date.today()} · valgrind (callgrind) · Python {sys.version.split()[0]} · "
        f"{count} transactions a variant, PostgreSQL\n"
    )
    print("| variant | instructions a transaction | of the bare one's |")
    print("|---|---:|---:|")
    for variant, instructions in per_transaction.items():
        bare = per_transaction.get(PAIRS.get(variant, ""))
        ratio = f"{instructions / bare:.2f}x" if bare else "-"
        print(f"| {VARIANTS[variant]} | {instructions:,.0f} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
