"""``python -m tests.chaos``: run the harness, print the report, exit 1 if an invariant
failed (2: bad arguments; 3: this machine cannot run it, and why)."""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
from dataclasses import fields
from typing import Any

from tests import hosts
from tests.chaos.harness import Config, Run


def _positive(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def parse(argv: list[str]) -> Config:
    defaults = Config()
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--messages", type=_positive, default=defaults.messages)
    parser.add_argument("--jobs", type=_positive, default=defaults.jobs)
    parser.add_argument("--kills", type=_positive, default=defaults.kills)
    parser.add_argument("--cuts", type=_positive, default=defaults.cuts)
    parser.add_argument(
        "--seconds", type=float, default=defaults.seconds, help="production and fault window"
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--producers", type=_positive, default=defaults.producers)
    parser.add_argument("--cut-min", type=float, default=defaults.cut_min)
    parser.add_argument("--cut-max", type=float, default=defaults.cut_max)
    parser.add_argument("--duplicates", type=_positive, default=defaults.duplicates)
    parser.add_argument("--pg-terminations", type=_positive, default=defaults.pg_terminations)
    parser.add_argument("--no-broker-restarts", dest="broker_restarts", action="store_false")
    parser.add_argument(
        "--no-pg-restart",
        dest="pg_restart",
        action="store_false",
        help="do not restart this machine's PostgreSQL (every user of it notices)",
    )
    parser.add_argument("--no-webhook-faults", dest="webhook_faults", action="store_false")
    parser.add_argument(
        "--webhook-in-worker",
        dest="webhook_in_request",
        action="store_false",
        help="B's webhook only stores; inbox_worker handles (default: HANDLE_IN_REQUEST).",
    )
    parser.add_argument("--webhook-slow-delay", type=float, default=defaults.webhook_slow_delay)
    parser.add_argument(
        "--max-takeover",
        type=float,
        default=defaults.max_takeover,
        help="fail if a cut-off host's rows are not released to the others within this (s)",
    )
    parser.add_argument("--fence-wait", type=float, default=defaults.fence_wait)
    parser.add_argument("--drain-timeout", type=float, default=defaults.drain_timeout)
    parser.add_argument(
        "--max-drain", type=float, default=None, help="fail if the drain takes longer (s)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the two databases")
    parser.add_argument("--report", default=None, help="write the report here as JSON")
    args = parser.parse_args(argv)
    if args.producers < 1:
        parser.error("--producers must be at least 1")
    if not 0 < args.cut_min <= args.cut_max:
        parser.error("need 0 < --cut-min <= --cut-max")
    return Config(**{f.name: getattr(args, f.name) for f in fields(Config)})


def summary(report: dict[str, Any]) -> str:
    """The report as text: counts, faults with their times, takeover per cut, drain."""
    m, faults = report.get("messages", {}), report.get("faults", {})
    jobs_a, jobs_b = report.get("jobs A", {}), report.get("jobs B", {})
    lines = [
        f"chaos: {m.get('intents')} messages {m.get('by type')} "
        f"to {m.get('by destination')}; jobs A {jobs_a.get('jobs')}, B {jobs_b.get('jobs')}",
        f"messages: lost {m.get('lost')}, not sent {m.get('not_sent')}, "
        f"duplicated effects {m.get('duplicated_effects')}, missing effects "
        f"{m.get('missing_effects')}, not handled {m.get('not_handled')}, stale skipped "
        f"{m.get('skipped_stale')}; strict {m.get('strict keys')}, latest {m.get('latest keys')}; "
        f"requests {m.get('requests')}",
        f"jobs A: {_jobs(jobs_a)}",
        f"jobs B: {_jobs(jobs_b)}",
    ]
    for side, figures in (("A", jobs_a), ("B", jobs_b)):
        if figures.get("reruns"):
            lines.append(
                f"  reruns {side} (each after its worker died or was cut off mid-job, "
                f"WorkerLost in its errors): {figures['reruns']}"
            )
    dup = report.get("duplicates", {})
    lines.append(
        f"duplicates: published again {dup.get('published again')} in rounds "
        f"{faults.get('duplicates published')}; suppressed (one inbox row and one effect "
        f"each, from B's database) {dup.get('suppressed (one row, one effect each)')}; left in "
        f"B's queues {dup.get('left in the brokers')}; the consumers' exit summaries "
        f"(clean exits only) said {report.get('duplicates suppressed (clean exits only)')}"
    )
    lines.append(
        f"faults: {faults.get('kills')} kills {faults.get('kills by kind')} "
        f"({faults.get('kills missed (process not running)')} missed: process not running), "
        f"connections terminated {faults.get('connections terminated')}"
    )
    for fault in faults.get("timeline", []):
        if fault["kind"] == "kill":
            continue
        extra = {k: v for k, v in fault.items() if k not in ("kind", "target", "at", "ended")}
        lines.append(
            f"  {fault['at']:7.1f}s - {fault['ended'] if fault['ended'] is not None else '?':>6}s "
            f"{fault['kind']} {fault['target']} {extra or ''}"
        )
    kills = [
        f"{f['at']}s {f.get('process')}" for f in faults.get("timeline", []) if f["kind"] == "kill"
    ]
    lines.append(f"  kills at: {', '.join(kills)}")
    for cut in report.get("takeover", []):
        lines.append(
            f"cut {cut['host']}: held {cut['held at the cut']} by {cut['workers']} worker(s); "
            f"released after {cut['released after (s)']} s, finished by others after "
            f"{cut['finished by others after (s)']} s, reconnected after "
            f"{cut['reconnected after (s)']} s; fencing: {cut['fenced rows compared']} finished "
            f"row(s) compared after the return, changed {len(cut['changed after the return'])}"
            + (f"; error {cut['error']}" if cut.get("error") else "")
        )
    lines.append(
        f"drain: production ended at {report.get('production ended (s)')} s, the last fault at "
        f"{report.get('last fault ended (s)')} s; everything done at "
        f"{report.get('drained (s)')} s: drain {report.get('drain after last fault (s)')} s; "
        f"run took {report.get('seconds')} s"
    )
    if report.get("remaining"):
        lines.append(f"remaining at the drain's end: {report['remaining']}")
    if faults.get("errors"):
        lines.append(f"faults that misfired: {faults['errors']}")
    lines += [f"FAIL: {failure}" for failure in report.get("failures", [])]
    lines.append("OK" if report.get("ok") else "FAILED")
    return "\n".join(lines)


def _jobs(figures: dict[str, Any]) -> str:
    keys = ("jobs", "failed", "never_ran", "retried", "rerun_after_lost_worker")
    return ", ".join(f"{k} {figures.get(k)}" for k in keys)


def main(argv: list[str]) -> int:
    config = parse(argv)
    reason = hosts.available()
    if reason is not None:
        print(f"chaos: cannot run here: {reason}", file=sys.stderr)
        return 3
    run = Run(config, log=lambda line: print(line, flush=True))

    def stopped(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stopped)  # restore everything on SIGTERM too
    try:
        report = run.run()
    finally:
        run.restore()
    if config.report:
        with open(config.report, "w") as out:
            json.dump(report, out, indent=2, default=str)
    print(summary(report), flush=True)
    if report["ok"] and not config.keep:
        shutil.rmtree(run.dir, ignore_errors=True)
    else:
        print(f"chaos: each process's output is in {run.dir}", flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
