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
    m, faults = report.get("messages", {}), report.get("faults", {})
    lines = [
        f"chaos: {m.get('intents')} messages {m.get('by type')}, "
        f"jobs A {report.get('jobs A', {}).get('jobs')} B {report.get('jobs B', {}).get('jobs')}",
        f"faults: {faults.get('kills')} kills {faults.get('kills by kind')}, "
        f"cuts {[(c['host'], c['seconds']) for c in faults.get('cuts', [])]}, "
        f"restarts {[(r['service'], r.get('down (s)')) for r in faults.get('restarts', [])]}, "
        f"connections terminated {faults.get('connections terminated')}, "
        f"duplicates published {faults.get('duplicates published')}",
        f"lost {m.get('lost')}, duplicated effects {m.get('duplicated_effects')}, "
        f"not handled {m.get('not_handled')}, stale skipped {m.get('skipped_stale')}, "
        f"strict {m.get('strict keys')}, latest {m.get('latest keys')}, "
        f"requests {m.get('requests')}",
        f"jobs A {_jobs(report.get('jobs A', {}))}; jobs B {_jobs(report.get('jobs B', {}))}",
        f"drained at {report.get('drained (s)')} s: {report.get('drain after last fault (s)')} s "
        f"after the last fault ({report.get('last fault ended (s)')} s) / production end "
        f"({report.get('production ended (s)')} s); run took {report.get('seconds')} s",
        f"duplicates suppressed (consumers' exit summaries, lower bound): "
        f"{report.get('duplicates suppressed (clean exits only)')}",
    ]
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
