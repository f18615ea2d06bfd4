"""The inbox's webhook under a real WSGI server: its throughput against a view that
only inserts the row, and commit → handled across two services over HTTP.

    python -m tests.benchmarks.webhook --requests 6000 --repeat 3 --rate 500 --seconds 10 \
        --batches 1,100

**Throughput.** Service B (database ``django_outbox_webhook_bench``) is served by
gunicorn, 2 sync workers. A load process posts pre-signed deliveries from 8 threads
as fast as they are answered, first to the inbox's webhook view (signature, envelope,
intake rules, the row stored), then, the table emptied, to the test project's
``bench/bare-insert/`` view (one bare ``INSERT`` of the same row, nothing checked),
alternately, the median of ``--repeat`` rounds. Every delivery must be answered 200
and stored.

**Latency.** Service A (the relay benchmark's database) commits one ``send()`` per
transaction from 4 producer processes paced to ``--rate``; its ``outbox_relay``, woken
by NOTIFY, posts each message to B's webhook (the ``http`` transport, signed, 8 at a
time), once with ``BATCH`` 1 (a request a message) and once with ``BATCH`` 100 (up to
100 messages a request, signed as a batch); B's ``inbox_worker``, woken by NOTIFY,
runs the handler, which notes the time; and again with B's source handling a first
attempt in the request (``HANDLE_IN_REQUEST``, ``--handling``).
Latency is the handler's time minus the commit's (same host, same clock).

**One at a time.** 200 deliveries posted one after the other over one kept-alive
connection, to gunicorn and to Django's ``runserver``: milliseconds each.

Nothing is asserted; the figures go to ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import date

import psycopg

from tests.benchmarks import common, inbox_latency, latency
from tests.benchmarks import relay as harness

B_DB = os.environ.get(
    "BENCH_WEBHOOK_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/django_outbox_webhook_bench"
)
PORT = int(os.environ.get("BENCH_WEBHOOK_PORT", "8766"))
SECRET = "webhook-bench-secret"
B_SETTINGS = {
    "DISPATCH": "notify",
    "INBOX": {"SOURCES": {"a": {"TRANSPORT": "webhook", "SECRET": SECRET}}},
}
A_SETTINGS = {
    "OUTBOX": {
        "DESTINATIONS": {
            "b": {
                "TRANSPORT": "http",
                "URL": f"http://127.0.0.1:{PORT}/inbox/a/",
                "SECRET": SECRET,
            }
        }
    },
    "DISPATCH": "notify",
}
THREADS = 8


def b_env(in_request: bool = False) -> dict[str, str]:
    """Service B's environment; *in_request*: its source has ``HANDLE_IN_REQUEST``."""
    settings = json.loads(json.dumps(B_SETTINGS))
    settings["INBOX"]["SOURCES"]["a"]["HANDLE_IN_REQUEST"] = in_request
    env = inbox_latency.service_env(B_DB, settings)
    env["OUTBOX_LOG_LEVEL"] = "ERROR"
    return env


def serve(
    workers: int = 2, runserver: bool = False, in_request: bool = False
) -> subprocess.Popen[bytes]:
    """gunicorn (or, with *runserver*, Django's development server) serving the test
    project for service B, returned once it answers."""
    command = [sys.executable, "-m", "gunicorn", "-w", str(workers), "-b", f"127.0.0.1:{PORT}"]
    command += ["--log-level", "warning", "testproject.wsgi"]
    if runserver:
        command = [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{PORT}"]
    server = subprocess.Popen(
        command,
        cwd=latency.ROOT,
        env=b_env(in_request),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", PORT), timeout=1).close()
            return server
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise RuntimeError("gunicorn did not start") from None
            time.sleep(0.1)


def prepared(count: int) -> list[tuple[bytes, dict[str, str]]]:
    """*count* signed deliveries, made before the clock starts."""
    from django_outbox import signing

    deliveries = []
    for n in range(count):
        body = json.dumps({"order": n, "amount": "12.50", "note": "webhook benchmark"}).encode()
        headers = {"outbox-type": "payment.captured", "outbox-message-id": str(uuid.uuid4())}
        headers["Outbox-Signature"] = signing.sign(SECRET, body, headers=headers)
        headers["Content-Type"] = "application/json"
        deliveries.append((body, headers))
    return deliveries


def post_all(path: str, deliveries: list[tuple[bytes, dict[str, str]]]) -> float:
    """POST every delivery to *path* from ``THREADS`` threads; deliveries per second."""
    order = itertools.count()
    failures: list[str] = []

    def work() -> None:
        while (n := next(order)) < len(deliveries) and not failures:
            body, headers = deliveries[n]
            connection = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
            try:
                connection.request("POST", path, body=body, headers=headers)
                response = connection.getresponse()
                answer = response.read()
                if response.status != 200:
                    failures.append(f"HTTP {response.status}: {answer[:200]!r}")
            finally:
                connection.close()

    threads = [threading.Thread(target=work) for _ in range(THREADS)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} deliveries failed, the first: {failures[0]}")
    return len(deliveries) / elapsed


def one_at_a_time(count: int, runserver: bool) -> float:
    """Milliseconds per delivery (median) when deliveries go one after the other over
    one kept-alive connection (httpx, as the ``http`` transport's lanes send), to
    gunicorn or to Django's runserver."""
    import httpx

    deliveries = prepared(count)
    server = serve(runserver=runserver)
    times = []
    try:
        with httpx.Client() as client:
            for body, headers in deliveries:
                started = time.perf_counter()
                answer = client.post(
                    f"http://127.0.0.1:{PORT}/inbox/a/", content=body, headers=headers
                )
                times.append(time.perf_counter() - started)
                if answer.status_code != 200:
                    raise RuntimeError(f"HTTP {answer.status_code}: {answer.text[:200]}")
    finally:
        server.terminate()
        server.wait(30)
    return statistics.median(times) * 1000


def stored(b: psycopg.Connection) -> int:
    return int(b.execute("SELECT count(*) FROM django_outbox_inbox").fetchone()[0])


def server_pids(server: subprocess.Popen[bytes]) -> list[int]:
    """The WSGI server's processes: its master and the workers it forked (Linux)."""
    pids = [server.pid]
    try:
        with open(f"/proc/{server.pid}/task/{server.pid}/children") as children:
            pids += [int(pid) for pid in children.read().split()]
    except OSError:
        pass
    return pids


#: Per view, the CPU seconds a delivery cost the WSGI server's processes and the
#: database server, one figure a round (``throughput``).
SERVER_CPU: dict[str, list[float]] = {}
DATABASE_CPU: dict[str, list[float]] = {}


def throughput(count: int, repeat: int) -> dict[str, float]:
    """Median deliveries per second of the webhook view and of the bare INSERT; the CPU
    each delivery cost gunicorn's processes and PostgreSQL goes to ``SERVER_CPU`` and
    ``DATABASE_CPU`` (read from ``/proc`` around each round)."""
    deliveries = prepared(count)
    rates: dict[str, list[float]] = {"webhook": [], "bare": []}
    paths = (("webhook", "/inbox/a/"), ("bare", "/bench/bare-insert/a/"))
    server = serve()
    try:
        # serve() returns once the master listens: its workers may not be forked yet, or
        # still loading Django. Answered deliveries on both paths mean they are up, so
        # their processes are all counted and their start-up is not.
        for _, path in paths:
            post_all(path, prepared(4 * THREADS))
        pids = server_pids(server)
        with psycopg.connect(B_DB, autocommit=True) as b:
            for _ in range(repeat):
                for name, path in paths:
                    b.execute("TRUNCATE django_outbox_inbox")
                    cpu, database = common.process_cpu(pids), common.server_cpu()
                    rates[name].append(post_all(path, deliveries))
                    SERVER_CPU.setdefault(name, []).append((common.process_cpu(pids) - cpu) / count)
                    DATABASE_CPU.setdefault(name, []).append(
                        (common.server_cpu() - database) / count
                    )
                    if stored(b) != count:
                        raise RuntimeError(f"{name}: {stored(b)} of {count} stored")
    finally:
        server.terminate()
        server.wait(30)
    return {name: statistics.median(values) for name, values in rates.items()}


def a_settings(batch: int) -> dict[str, object]:
    """Service A's settings, its ``http`` destination posting *batch* messages a request."""
    settings = json.loads(json.dumps(A_SETTINGS))
    settings["OUTBOX"]["DESTINATIONS"]["b"]["BATCH"] = batch
    return settings


def commit_to_handled(
    rate: float, seconds: float, batch: int = 1, in_request: bool = False
) -> list[float]:
    """Milliseconds from A's commit to B's handler, per message; A's relay posting
    *batch* messages a request (the ``http`` transport's ``BATCH``); with *in_request*,
    B's source handles a first attempt in the request (``HANDLE_IN_REQUEST``; B's
    ``inbox_worker`` runs all the same, as it would in production, for retries)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_outbox_message, django_outbox_key, django_outbox_worker")
    with psycopg.connect(B_DB, autocommit=True) as b:
        b.execute("TRUNCATE django_outbox_inbox, django_outbox_inbox_cursor, shop_payment")
    server = serve(in_request=in_request)
    a_env = inbox_latency.service_env(harness.BENCH_DB, a_settings(batch))
    relay = subprocess.Popen(
        [sys.executable, "manage.py", "outbox_relay", "--interval", "5"],
        cwd=latency.ROOT,
        env=a_env,
        stdout=subprocess.DEVNULL,
    )
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "inbox_worker", "--interval", "5"],
        cwd=latency.ROOT,
        env=b_env(in_request),
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(3)  # every process is up
        committed = inbox_latency.run_producers(rate, seconds, a_settings(batch))
        handled = inbox_latency.wait_handled(B_DB, committed)
    finally:
        for process in (relay, worker, server):
            process.terminate()
            process.wait(30)
    # The warm-up's messages are handled too: count only the measured ones.
    missing = sum(1 for message in committed if message not in handled)
    if missing:
        print(f"{missing} of {len(committed)} messages not handled within 60 s")
    return sorted((handled[m] - t) * 1000 for m, t in committed.items() if m in handled)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument(
        "--batches",
        default="1,100",
        help="The http transport's BATCH values to measure commit → handled with.",
    )
    parser.add_argument(
        "--handling",
        default="worker,request",
        help="Where B handles, for commit → handled: 'worker' (stored by the view, handled "
        "by inbox_worker) and/or 'request' (HANDLE_IN_REQUEST).",
    )
    parser.add_argument(
        "--latency-only", action="store_true", help="Only commit → handled over HTTP."
    )
    parser.add_argument("--informational", action="store_true", help="A reduced CI run.")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    harness.setup_django()  # service A's database, migrated
    common.ensure_database(B_DB)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"], cwd=latency.ROOT, env=b_env(), check=True
    )
    if args.latency_only:
        sequential, rates = {}, {}
    else:
        sequential = {
            kind: one_at_a_time(200, kind == "runserver") for kind in ("gunicorn", "runserver")
        }
        rates = throughput(args.requests, args.repeat)
    handlings = args.handling.split(",")
    delays = {
        (batch, handling): commit_to_handled(
            args.rate, args.seconds, batch, in_request=handling == "request"
        )
        for batch in batches
        for handling in handlings
    }
    print(
        f"\n{date.today()} · {os.cpu_count()} cores · Python {platform.python_version()} · "
        f"gunicorn, 2 sync workers · {args.requests} deliveries from {THREADS} threads, "
        f"median of {args.repeat}\n"
    )
    targets = {}
    if rates:
        ratio = rates["webhook"] / rates["bare"]
        cpu = {name: statistics.median(SERVER_CPU[name]) * 1e6 for name in rates}
        database = {name: statistics.median(DATABASE_CPU[name]) * 1e6 for name in rates}
        # No /proc (not Linux): no CPU figures, and no ratio of them.
        cpu_ratio = f" ({cpu['webhook'] / cpu['bare']:.2f}x)" if cpu["bare"] else ""
        print(
            "| view | deliveries/s | of the bare INSERT | gunicorn CPU a delivery "
            "| PostgreSQL CPU a delivery |"
        )
        print("|---|---:|---:|---:|---:|")
        print(
            f"| the inbox's webhook | {rates['webhook']:,.0f} | {ratio:.2f} "
            f"| {cpu['webhook']:,.0f} µs{cpu_ratio} "
            f"| {database['webhook']:,.0f} µs |"
        )
        print(
            f"| bare INSERT of the row | {rates['bare']:,.0f} | 1.00 | {cpu['bare']:,.0f} µs "
            f"| {database['bare']:,.0f} µs |"
        )
        print(
            "\nOne delivery after the other over one connection: gunicorn "
            f"{sequential['gunicorn']:.1f} ms each, Django's runserver "
            f"{sequential['runserver']:.1f} ms each ({1000 / sequential['runserver']:.0f}/s: "
            "it writes an answer in two sends, and Nagle's algorithm holds the second until "
            "the client's delayed ACK of the first)"
        )
        targets["webhook ≥ 0.8 of the bare INSERT"] = ratio >= 0.8
    print(
        f"\nA commit → NOTIFY → relay → HTTP → B's webhook (gunicorn) → handler: in the "
        f"request (HANDLE_IN_REQUEST), or NOTIFY → inbox_worker; {args.rate:g}/s offered "
        f"for {args.seconds:g} s:\n"
    )
    print("| BATCH | handled in | handled | p50 ms | p95 ms | p99 ms | max ms |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for (batch, handling), measured in delays.items():
        if not measured:
            print(f"| {batch} | {handling} | 0 | | | | |")
            targets[f"commit → handled at {args.rate:g}/s, BATCH {batch}, {handling}"] = False
            continue
        p50, p95, p99 = (latency.percentile(measured, q) for q in (0.50, 0.95, 0.99))
        print(
            f"| {batch} | {handling} | {len(measured):,} | {p50:.1f} | {p95:.1f} | {p99:.1f} | "
            f"{measured[-1]:.1f} |"
        )
        targets[f"commit → handled p99 ≤ 50 ms at {args.rate:g}/s, BATCH {batch}, {handling}"] = (
            p99 <= 50
        )
    note = " (reduced run, informational)" if args.informational else ""
    for target, met in targets.items():
        print(f"target {target}: {'met' if met else 'MISSED'}{note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
