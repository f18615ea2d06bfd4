"""``make bench-targets`` collects the verdict lines the harnesses print: each format a
harness uses is read, and lines that only report a figure are not taken for verdicts."""

from __future__ import annotations

from tests.benchmarks.targets import verdicts


def test_reads_each_harness_verdict_format() -> None:
    output = "\n".join(
        [
            # relay and latency: "- NAME: met|missed"
            "- redis relay >= 0.85 of lean: met",
            "- notify → redis at 500/s: p50 ≤ 2 ms and p99 ≤ 10 ms (issue 17): missed",
            # jobs, inbox, webhook: "target NAME: met|MISSED[ note]"
            "target inbox_consume ≥ 0.85 of the lean consumer: MISSED",
            "target webhook ≥ 0.8 of the bare INSERT: met (reduced run, informational)",
            "target 1 process ≥ 10 x db_worker: not run (django-tasks-db not installed)",
        ]
    )

    assert verdicts(output) == [
        ("redis relay >= 0.85 of lean", "met"),
        ("notify → redis at 500/s: p50 ≤ 2 ms and p99 ≤ 10 ms (issue 17)", "missed"),
        ("inbox_consume ≥ 0.85 of the lean consumer", "missed"),
        ("webhook ≥ 0.8 of the bare INSERT", "met"),
        ("1 process ≥ 10 x db_worker", "not run"),
    ]


def test_figures_are_not_verdicts() -> None:
    output = "\n".join(
        [
            "- notify → redis at 500/s against the lean relay: p50 1.25x, p99 1.52x",
            "| relay PostgreSQL → Redis, django-outbox | 26,460 | 1.31 | >= 0.85 |",
            "targets met: 3 of 4",
            "- a measurement: metres 12",
        ]
    )

    assert verdicts(output) == []
