"""What service A commits, and the duplicates injected at the brokers: run as processes
of the harness, with service A's database and settings in the environment.

``python -m tests.chaos.workload produce --index I --of P ...`` commits its share of
the units, one transaction each (a business row, and its message or jobs), paced over
``--seconds`` from ``--t0``. A producer that was killed and restarted asks the database
which of its units committed and goes on with the others: a unit is committed once.

``python -m tests.chaos.workload duplicate --count N --seed S`` publishes again, through
the destinations' own transports, N messages the relays have already sent.

The plan (which unit is which message or job) is a pure function of the arguments, so
the harness's checks compute the same expectations without asking anyone.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

#: A's destinations, which are also B's source names.
ROUTES = ("rabbit", "redis", "webhook")


@dataclass(frozen=True)
class Plan:
    """Which units there are: ``messages`` message units and ``jobs`` job units."""

    messages: int
    jobs: int
    strict_keys: int = 12
    latest_keys: int = 12
    serial_keys: int = 6
    batch_size: int = 3

    def message(self, i: int) -> dict[str, object]:
        """The message of unit ``m<i>``: its type, destination, key and flags."""
        kind = i % 10
        if kind < 5:
            return {"type": "chaos.order", "to": ROUTES[i % 3], "key": None, "job": i % 4 == 0}
        if kind < 7:
            k = i % self.strict_keys
            return {"type": "chaos.step", "to": ROUTES[k % 3], "key": f"s{k}", "job": False}
        if kind < 9:
            k = i % self.latest_keys
            return {"type": "chaos.status", "to": ROUTES[k % 3], "key": f"l{k}", "job": False}
        return {"type": "chaos.quote", "to": ROUTES[i % 3], "key": None, "job": False}

    def job(self, j: int) -> str:
        """The kind of unit ``j<j>``: run, flaky, serial or batch."""
        kind = j % 10
        return "run" if kind < 6 else "flaky" if kind < 8 else "serial" if kind < 9 else "batch"

    def units(self) -> list[str]:
        """Every unit, message and job units interleaved evenly, in commit order."""
        spread = [(i / max(self.messages, 1), f"m{i}") for i in range(self.messages)]
        spread += [((j + 0.5) / max(self.jobs, 1), f"j{j}") for j in range(self.jobs)]
        return [unit for _, unit in sorted(spread)]

    def expected_jobs_a(self) -> int:
        kinds = [self.job(j) for j in range(self.jobs)]
        return sum(self.batch_size + 1 if kind == "batch" else 1 for kind in kinds)

    def expected_jobs_b(self) -> int:
        return sum(1 for i in range(self.messages) if self.message(i)["job"])


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()


def _commit(plan: Plan, unit: str) -> None:
    from django.db import transaction

    import django_outbox
    from django_outbox.jobs import batch
    from testproject.shop import jobs
    from testproject.shop.models import Order

    with transaction.atomic():
        Order.objects.create(customer=f"chaos-{unit}", total_cents=int(unit[1:]))
        n = int(unit[1:])
        if unit[0] == "m":
            spec = plan.message(n)
            payload: dict[str, object] = {"unit": unit}
            if spec["type"] == "chaos.order" and spec["job"]:
                payload["job"] = True
            if spec["type"] == "chaos.status":
                payload["status"] = f"status-of-{unit}"
            django_outbox.send(
                str(spec["type"]),
                payload,
                to=str(spec["to"]),
                key=spec["key"],  # type: ignore[arg-type]
                reply_to="b" if spec["type"] == "chaos.quote" else None,
            )
            return
        kind = plan.job(n)
        if kind == "run":
            jobs.chaos_run.enqueue(unit)
        elif kind == "flaky":
            jobs.chaos_flaky.enqueue(unit)
        elif kind == "serial":
            jobs.chaos_serial.enqueue(key=f"z{n % plan.serial_keys}", n=n)
        else:
            with batch(on_finish=jobs.chaos_batch_done, tag=unit):
                for part in range(plan.batch_size):
                    jobs.chaos_run.enqueue(f"{unit}.{part}")


def produce(plan: Plan, index: int, of: int, t0: float, seconds: float) -> int:
    """Commit this producer's units that are not committed yet; return how many."""
    _setup()
    from testproject.shop.models import Order

    units = plan.units()
    done = {
        customer.removeprefix("chaos-")
        for customer in Order.objects.filter(customer__startswith="chaos-").values_list(
            "customer", flat=True
        )
    }
    committed = 0
    for position, unit in enumerate(units):
        if position % of != index or unit in done:
            continue
        due = t0 + seconds * position / max(len(units), 1)
        pause = due - time.time()
        if pause > 0:
            time.sleep(pause)
        for tries in itertools.count(1):
            try:
                _commit(plan, unit)
                break
            except Exception as exc:
                if tries == 100:  # not a passing fault: the supervisor shows the exit
                    raise  # a terminated connection, a cut: try the unit again
                from django.db import close_old_connections, connection

                print(f"producer {index}: {unit} failed ({exc!r}); again", flush=True)
                connection.close()
                close_old_connections()
                time.sleep(0.5)
                if Order.objects.filter(customer=f"chaos-{unit}").exists():
                    break  # the commit went through before the error reached us
        committed += 1
    return committed


def _sent_messages(count: int, seed: int) -> Iterator[object]:
    from django_outbox.models import OutboxMessage, OutboxState

    ids = list(
        OutboxMessage.objects.filter(state=OutboxState.SENT, destination__in=ROUTES)
        .order_by("id")
        .values_list("id", flat=True)
    )
    chosen = random.Random(seed).sample(ids, min(count, len(ids)))
    yield from OutboxMessage.objects.filter(id__in=chosen).order_by("id")


def duplicate(count: int, seed: int) -> dict[str, object]:
    """Publish *count* sent messages again, through their destinations' transports;
    say which went out (by destination) and how many could not (a broker down)."""
    _setup()
    from django_outbox.conf import get_settings
    from django_outbox.outbox.envelope import Envelope
    from django_outbox.outbox.transports.registry import get_transport

    by_route: dict[str, list[Envelope]] = {}
    for message in _sent_messages(count, seed):
        by_route.setdefault(message.destination, []).append(Envelope.from_message(message))  # type: ignore[attr-defined]
    published: dict[str, int] = {}
    failed: dict[str, int] = {}
    ids: dict[str, list[str]] = {}
    errors: dict[str, str] = {}
    for route, envelopes in by_route.items():
        transport = get_transport(get_settings().outbox.destination(route))
        outcomes = transport.publish(envelopes)
        # Missing from the outcomes: not attempted.
        went = [
            str(e.message_id)
            for e in envelopes
            if e.message_id in outcomes and outcomes[e.message_id] is None
        ]
        ids[route] = went
        published[route] = len(went)
        failed[route] = len(envelopes) - len(went)
        errors.update((route, repr(o)[:200]) for o in outcomes.values() if o is not None)
    return {"published": published, "failed": failed, "errors": errors, "ids": ids}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.workload")
    sub = parser.add_subparsers(dest="command", required=True)
    prod = sub.add_parser("produce")
    prod.add_argument("--index", type=int, required=True)
    prod.add_argument("--of", type=int, required=True)
    prod.add_argument("--t0", type=float, required=True)
    prod.add_argument("--seconds", type=float, required=True)
    dup = sub.add_parser("duplicate")
    dup.add_argument("--count", type=int, required=True)
    dup.add_argument("--seed", type=int, required=True)
    for each in (prod, dup):
        each.add_argument("--messages", type=int, required=True)
        each.add_argument("--jobs", type=int, required=True)
    args = parser.parse_args(argv)
    plan = Plan(messages=args.messages, jobs=args.jobs)
    if args.command == "produce":
        committed = produce(plan, args.index, args.of, args.t0, args.seconds)
        print(json.dumps({"committed": committed}), flush=True)
    else:
        print(json.dumps(duplicate(args.count, args.seed)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
