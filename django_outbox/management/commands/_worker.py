"""The shared shape of ``outbox_relay`` and ``jobs_worker``: a ``WorkerLoop`` over a
runner, in the foreground, with the same options, signals and exit summary."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS

from django_outbox.engine.loop import WorkerLoop, settle_heap
from django_outbox.engine.runner import Runner, RunResult
from django_outbox.exceptions import ConfigurationError
from django_outbox.management.commands._args import non_negative_float, port_number, positive_int


class WorkerCommand(BaseCommand):
    #: The command's name in its banner and summary, and what its rows are called.
    name = ""
    noun = "row"
    done_verb = "done"
    #: Whether the runner may claim ahead on a helper thread (``--no-prefetch`` turns it
    #: off); a runner in lock mode never does, and its command has no such option.
    prefetches = True
    #: What ``--max-batches`` counts (idle polls do not count).
    batch_help = "Exit after this many batches that carried rows (idle polls do not count)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)
        parser.add_argument(
            "--batch", type=positive_int, default=None, help=f"{self.noun.capitalize()}s per claim."
        )
        parser.add_argument(
            "--interval",
            type=non_negative_float,
            default=1.0,
            help="Seconds to wait between polls when idle (default 1).",
        )
        parser.add_argument(
            "--sweep-interval",
            type=non_negative_float,
            default=10.0,
            help="Seconds between rescues of expired leases (default 10). Rows of a worker "
            "that died are rescued sooner, by the heartbeats of the live ones.",
        )
        parser.add_argument("--until-empty", action="store_true", help="Exit once nothing is due.")
        parser.add_argument("--max-batches", type=positive_int, default=None, help=self.batch_help)
        parser.add_argument("--no-listen", action="store_true", help="Poll; do not LISTEN.")
        if self.prefetches:
            parser.add_argument(
                "--no-prefetch",
                action="store_true",
                help="Claim each batch after the last one is recorded, on one thread, instead "
                "of on a helper thread meanwhile: for several worker processes on a host whose "
                "few cores they share with the database.",
            )
        parser.add_argument(
            "--json", action="store_true", help="Print the exit summary as one JSON object."
        )
        add_metrics_port(parser)

    def runner(self, options: dict[str, Any]) -> Runner:
        raise NotImplementedError

    def banner(self, runner: Runner, options: dict[str, Any]) -> str:
        raise NotImplementedError

    def handle(self, *args: Any, **options: Any) -> None:
        serve_metrics(options)
        runner = self.runner(options)
        runner.prefetch = not options.get("no_prefetch", False)
        worker = WorkerLoop(
            runner,
            interval=options["interval"],
            sweep_interval=options["sweep_interval"],
            until_empty=options["until_empty"],
            max_batches=options["max_batches"],
            listen=not options["no_listen"],
            report=self._report if options["verbosity"] >= 2 else None,
        )
        signal.signal(signal.SIGTERM, worker.stop)
        signal.signal(signal.SIGINT, worker.stop)
        if options["verbosity"] >= 1 and not options["json"]:
            self.stdout.write(self.banner(runner, options))
        settle_heap()
        started = time.monotonic()
        total = worker.run()
        if options["json"]:
            self.stdout.write(json.dumps(total.as_dict(), sort_keys=True))
        elif options["verbosity"] >= 1:
            elapsed = time.monotonic() - started
            self.stdout.write(
                f"{self.name} stopped after {elapsed:.1f}s: {total.done} {self.done_verb}, "
                f"{total.retried} to retry, {total.failed} failed, in {total.batches} batch(es)"
                + (f"; {worker.errors} error(s), see the log" if worker.errors else "")
            )

    def _report(self, result: RunResult) -> None:
        self.stdout.write(json.dumps(result.as_dict(), sort_keys=True))


def add_metrics_port(parser: CommandParser) -> None:
    """The ``--metrics-port`` option of every long-running command."""
    parser.add_argument(
        "--metrics-port",
        type=port_number,
        default=None,
        help="Serve Prometheus metrics on this port (needs the 'prometheus' extra; with "
        "several processes on a host, set PROMETHEUS_MULTIPROC_DIR).",
    )


def serve_metrics(options: dict[str, Any]) -> None:
    """Start the metrics endpoint if ``--metrics-port`` was given."""
    if options.get("metrics_port") is not None:
        from django_outbox import metrics

        try:
            metrics.serve(options["metrics_port"])
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
