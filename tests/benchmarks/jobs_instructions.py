"""Instructions one no-op job costs ``jobs_worker``'s drain and the lean loops, counted
by valgrind: the same figure on a busy machine as on an idle one.

    python -m tests.benchmarks.jobs_instructions --jobs 5000

The jobs benchmark's CPU per job moves by a fifth between runs on two shared cores
(``tests.benchmarks.jobs``); a change of a few per cent cannot be told from that.
This counts what the worker's Python process executes instead, in three variants:

- ``jobs_worker``: the engine's drain (``Jobs().drain()``, what ``jobs_worker`` runs
  when woken), its claims on a helper thread as in production;
- the lean loop keeping Django's Tasks contract (``lean_jobs --contract``);
- the bare lean loop (``lean_jobs``).

Each runs in a process of its own under ``valgrind --tool=callgrind``, against the
jobs benchmark's database: it fills and drains 500 jobs to warm up, fills ``--jobs``
more, and drains them or not; the difference between the two counts, divided by
``--jobs``, is one job's own instructions. PostgreSQL's work is not counted (see
``make bench-jobs`` for its share).

Needs valgrind (Debian: ``apt install valgrind``); six runs under valgrind take about
six minutes for 5,000 jobs. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

from tests.benchmarks import common
from tests.benchmarks import jobs as harness

#: The variants by the name ``--variants`` takes, with the label the table shows.
VARIANTS = {
    "ours": "jobs_worker",
    "contract": "lean loop + Tasks contract",
    "bare": "bare lean loop",
}
WARM = 500


def drain(variant: str) -> int:
    """Run every due job once, as *variant* does; the jobs it ran."""
    if variant == "ours":
        from django_outbox.jobs.running import Jobs

        return Jobs().drain(time_budget=3600).done
    import psycopg

    from tests.benchmarks import lean_jobs

    run_job = lean_jobs.contract() if variant == "contract" else None
    functions: dict[str, Any] = {}
    worker = uuid.uuid4()
    ran = 0
    with psycopg.connect(harness.BENCH_DB, autocommit=True) as conn:
        while done := lean_jobs.one_batch(conn, worker, run_job, functions):
            ran += done
    return ran


def child(variant: str, count: int, drained: bool) -> None:
    """Warm *variant* up, then fill *count* jobs and, if *drained*, run them."""
    harness.setup_django()
    from django_outbox.engine.loop import settle_heap

    harness.truncate()
    harness.fill(WARM)
    if drain(variant) != WARM:
        raise RuntimeError(f"{variant} did not run the {WARM} warm-up jobs")
    # As jobs_worker does before its loop: what start-up loaded (Django, the app
    # registry) out of the collector's sight. Every variant's process has loaded it.
    settle_heap()
    harness.fill(count)
    if drained and drain(variant) != count:
        raise RuntimeError(f"{variant} did not run the {count} jobs")


def counted(variant: str, count: int, drained: bool, smoke: bool = False) -> int:
    """Instructions valgrind counted in a child process of *variant* (with *smoke*, the
    child runs without valgrind and 0 is returned)."""
    arguments = ["--child", variant, str(count), "drained" if drained else "filled"]
    return common.instructions(
        "tests.benchmarks.jobs_instructions", arguments, harness.ROOT, harness.child_env(), smoke
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    common.add_counting_arguments(parser, ("VARIANT", "JOBS", "DRAINED"), VARIANTS)
    args = parser.parse_args()
    if args.child:
        variant, count, drained = args.child
        child(variant, int(count), drained == "drained")
        return 0
    return common.count_variants(
        parser,
        args,
        VARIANTS,
        counted,
        count=args.jobs,
        item="job",
        title=f"{args.jobs} no-op jobs a variant, PostgreSQL",
    )


if __name__ == "__main__":
    raise SystemExit(main())
