"""A long run at a steady rate: is anything growing? (issue 17 §8)

    python -m tests.benchmarks.soak --rate 700 --minutes 8

Producer processes commit transactions at a steady pace, each with one ``send()``
(published to Redis by one ``outbox_relay`` woken by NOTIFY) and one ``enqueue()``
of a no-op job (run by one ``jobs_worker`` woken by NOTIFY): *rate* items a second
in all, half messages and half jobs. Nothing is purged, so the finished rows pile up
beside the small backlog, as in a deployment whose purge runs nightly.

Every *window* seconds the harness reports, for the window:

- commit → processed latency from the rows' own times (a message's ``created_at`` →
  ``sent_at``, a job's ``created_at`` → ``finished_at``), p50 and p99;
- the backlog (rows not yet processed), sampled every second: mean and max;
- CPU per item of the relay and of the worker (``/proc``);
- the claim's cost in the database: the blocks one claim's due scan reads (its
  ``SELECT``, without the lock, under ``EXPLAIN (ANALYZE, BUFFERS)`` once a window).
  The JSON also keeps the due indexes' reads per item from ``pg_stat_user_indexes``
  and ``pg_statio_user_indexes``, which include the harness's own backlog counts;
- the tables' dead rows and autovacuum runs so far (``pg_stat_user_tables``);
- the relay's and the worker's memory (RSS), open file descriptors, and the
  database's connections: flat, or leaking.

Nothing is asserted: the figures are printed as a table (and ``--json`` writes
them to a file). The service's database is dropped and made again at the start.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from datetime import date
from pathlib import Path

import psycopg

from tests.benchmarks import common

ROOT = Path(__file__).resolve().parents[2]
DATABASE = os.environ.get(
    "BENCH_SOAK_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/django_outbox_soak"
)
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
QUEUE = "outbox-soak"
PRODUCERS = 4
SETTINGS = {
    "OUTBOX": {
        "DESTINATIONS": {"default": {"TRANSPORT": "kombu", "URL": REDIS_URL, "QUEUE": QUEUE}}
    },
    "DISPATCH": "notify",
}
#: The indexes each claim starts from: their reads per item processed say whether a
#: claim's cost grows with the rows beside the backlog.
DUE_INDEXES = ("outbox_msg_due_idx", "outbox_job_due_idx", "outbox_job_due_all_idx")
TABLES = ("django_outbox_message", "django_outbox_job")


def child_env() -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": DATABASE,
        "OUTBOX_SETTINGS_JSON": json.dumps(SETTINGS),
        "OUTBOX_LOG_LEVEL": "ERROR",
        "PYTHONUNBUFFERED": "1",
        "TESTPROJECT_CONN_MAX_AGE": "60",
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
    }


def produce(rate: float, seconds: float, out: multiprocessing.Queue) -> None:
    """One producer: a transaction with one send() and one enqueue() every 1/rate s."""
    os.environ.update(child_env())
    import django

    django.setup()
    from django.db import transaction

    import django_outbox
    from testproject.shop import jobs

    interval = 1.0 / rate
    start = time.perf_counter()
    n = late = 0
    while (elapsed := time.perf_counter() - start) < seconds:
        due = n * interval
        if due > elapsed:
            time.sleep(due - elapsed)
        elif elapsed - due > 1.0:
            late += 1  # the producer itself fell behind: the machine is saturated
        with transaction.atomic():
            django_outbox.send("soak.tick", {"n": n})
            jobs.noop.enqueue()
        n += 1
    out.put({"transactions": n, "late": late})


def start(command: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "manage.py", *command],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.DEVNULL,
    )


def process_state(pid: int) -> tuple[float, int]:
    """RSS in MiB and open file descriptors of *pid*."""
    rss = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return rss / 1024, len(os.listdir(f"/proc/{pid}/fd"))


class Sampler:
    """Samples the backlog every second, in a thread."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.samples: list[tuple[float, int, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.wait(1.0):
            (messages,) = self.conn.execute(BACKLOG_MESSAGES).fetchone()
            (jobs,) = self.conn.execute(BACKLOG_JOBS).fetchone()
            self.samples.append((time.monotonic(), messages, jobs))

    def take(self, since: float) -> list[tuple[float, int, int]]:
        return [s for s in self.samples if s[0] >= since]


#: The scans each claim starts with (its due SELECT, without the lock), explained once a
#: window: the index blocks one claim reads, whatever else reads the index meanwhile.
CLAIM_SCANS = {
    "messages": (
        "SELECT id FROM django_outbox_message WHERE state = 'should_be_sent' AND NOT blocked "
        "AND available_at <= now() ORDER BY available_at, id LIMIT 500"
    ),
    "jobs": (
        "SELECT id FROM django_outbox_job WHERE state = 'READY' AND NOT blocked "
        "AND available_at <= now() ORDER BY priority DESC, available_at, id LIMIT 500"
    ),
}


def claim_blocks(conn: psycopg.Connection, sql: str) -> int:
    """Shared blocks (hit or read) one run of a claim's due scan touches."""
    ((plan,),) = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}").fetchall()
    top = plan[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


def index_reads(conn: psycopg.Connection) -> dict[str, tuple[int, int]]:
    """Per due index: (entries read by scans, blocks read or hit) so far."""
    rows = conn.execute(
        "SELECT s.indexrelname, s.idx_tup_read, io.idx_blks_read + io.idx_blks_hit "
        "FROM pg_stat_user_indexes s JOIN pg_statio_user_indexes io USING (indexrelid) "
        "WHERE s.indexrelname = ANY(%s)",
        [list(DUE_INDEXES)],
    ).fetchall()
    return {name: (entries, blocks) for name, entries, blocks in rows}


def table_state(conn: psycopg.Connection) -> dict[str, tuple[int, int, int]]:
    """Per table: (live rows, dead rows, autovacuum runs) as the statistics say."""
    rows = conn.execute(
        "SELECT relname, n_live_tup, n_dead_tup, autovacuum_count FROM pg_stat_user_tables "
        "WHERE relname = ANY(%s)",
        [list(TABLES)],
    ).fetchall()
    return {name: (live, dead, runs) for name, live, dead, runs in rows}


def vacuum_options(conn: psycopg.Connection, table: str) -> list[str]:
    (options,) = conn.execute(
        "SELECT reloptions FROM pg_class WHERE oid = to_regclass(%s)", [table]
    ).fetchone()
    return options or []


def latencies(conn: psycopg.Connection, sql: str, since: float, until: float) -> list[float]:
    rows = conn.execute(sql, [since, until]).fetchall()
    return sorted(r[0] for r in rows)


# The harness's own queries go through the partial indexes of the states they count:
# a condition that matches no index's would scan millions of finished rows (in parallel
# workers) every second and take the machine from what it measures.
BACKLOG_MESSAGES = (
    "SELECT (SELECT count(*) FROM django_outbox_message "
    "        WHERE state = 'should_be_sent' AND NOT blocked) "
    "     + (SELECT count(*) FROM django_outbox_message WHERE state = 'sending')"
)
BACKLOG_JOBS = (
    "SELECT (SELECT count(*) FROM django_outbox_job WHERE state = 'READY' AND NOT blocked) "
    "     + (SELECT count(*) FROM django_outbox_job WHERE state = 'RUNNING')"
)
MESSAGE_LATENCY = (
    "SELECT (extract(epoch FROM sent_at - created_at) * 1000)::float8 FROM django_outbox_message "
    "WHERE state IN ('sent', 'cancelled') "
    "AND finished_at >= to_timestamp(%s) AND finished_at < to_timestamp(%s) AND state = 'sent'"
)
JOB_LATENCY = (
    "SELECT (extract(epoch FROM finished_at - created_at) * 1000)::float8 FROM django_outbox_job "
    "WHERE state IN ('SUCCESSFUL', 'FAILED') "
    "AND finished_at >= to_timestamp(%s) AND finished_at < to_timestamp(%s)"
)
FINISHED = (
    "SELECT (SELECT count(*) FROM django_outbox_message WHERE state IN ('sent', 'cancelled')), "
    "       (SELECT count(*) FROM django_outbox_job WHERE state IN ('SUCCESSFUL', 'FAILED'))"
)


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else float("nan")


def trim_redis(stop: threading.Event) -> None:
    """Empty the destination list now and then, so Redis does not grow with the run."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    while not stop.wait(2.0):
        client.delete(QUEUE)
    client.close()


def prepare(finished: int, untuned: bool) -> None:
    """A new database, migrated; with *finished*, that many finished messages and jobs
    put beside the coming backlog; with *untuned*, the queue tables on the server's
    autovacuum defaults (migration 0022 undone by hand, to compare)."""
    common.recreate_database(DATABASE)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=child_env(), check=True
    )
    if finished:
        started = time.perf_counter()
        prefill(finished)
        print(f"{finished:,} finished rows a table in {time.perf_counter() - started:.0f} s")
    if untuned:
        from django_outbox.engine import vacuum

        with psycopg.connect(DATABASE, autocommit=True) as conn, conn.cursor() as cursor:
            for table in TABLES:
                vacuum.untune(cursor, lambda name: f'"{name}"', table)


def prefill(rows: int) -> None:
    """*rows* finished messages and jobs, created over the 7 days before yesterday: the
    partition benchmark's fill (one ``INSERT … SELECT FROM generate_series`` a table,
    its secondary indexes built again after), both tables at once."""
    from concurrent.futures import ThreadPoolExecutor

    saved = dict(os.environ)  # the fills' modules set the environment of their harness
    from tests.benchmarks import partitions

    os.environ.clear()
    os.environ.update(saved)
    outbox, _inbox, jobs = partitions.statements()

    def fill(table: str, statement: str) -> None:
        with psycopg.connect(DATABASE, autocommit=True) as conn:
            conn.execute("SET maintenance_work_mem = '1GB'")
            found = conn.execute(partitions.SECONDARY, [table, False]).fetchall()
            for index, constraint, _ in found:
                if constraint:
                    conn.execute(f'ALTER TABLE "{table}" DROP CONSTRAINT "{constraint}"')
                else:
                    conn.execute(f'DROP INDEX "{index}"')
            conn.execute(statement, {"rows": rows, "days": 7})
            for _index, constraint, definition in found:
                if constraint:
                    conn.execute(
                        f'ALTER TABLE "{table}" ADD CONSTRAINT "{constraint}" {definition}'
                    )
                else:
                    conn.execute(definition)
            conn.execute(f'VACUUM ANALYZE "{table}"')

    with ThreadPoolExecutor(2) as pool:
        for done in [
            pool.submit(fill, "django_outbox_message", outbox),
            pool.submit(fill, "django_outbox_job", jobs),
        ]:
            done.result()
    with psycopg.connect(DATABASE, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=700, help="items/s, half of each kind")
    parser.add_argument("--minutes", type=float, default=8)
    parser.add_argument("--window", type=float, default=30, help="seconds a report line")
    parser.add_argument("--json", help="write the windows to this file")
    parser.add_argument(
        "--finished", type=int, default=0, help="finished messages and jobs put there first"
    )
    parser.add_argument(
        "--untuned",
        action="store_true",
        help="the queue tables on the server's autovacuum defaults (to compare)",
    )
    args = parser.parse_args()
    seconds = args.minutes * 60
    prepare(args.finished, args.untuned)
    relay = start(["outbox_relay", "--interval", "5"])
    worker = start(["jobs_worker"])
    stop = threading.Event()
    threading.Thread(target=trim_redis, args=(stop,), daemon=True).start()
    conn = psycopg.connect(DATABASE, autocommit=True)
    time.sleep(4)  # both are in their loops
    sampler = Sampler(psycopg.connect(DATABASE, autocommit=True))
    sampler.thread.start()
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    transactions_rate = args.rate / 2
    producers = [
        context.Process(target=produce, args=(transactions_rate / PRODUCERS, seconds, results))
        for _ in range(PRODUCERS)
    ]
    for process in producers:
        process.start()
    time.sleep(2)  # the producers have started Django
    windows: list[dict] = []
    (autovacuum,) = conn.execute("SHOW autovacuum").fetchone()
    options = {t: vacuum_options(conn, t) for t in TABLES}
    print(
        f"\n{date.today()} · {os.cpu_count()} cores · Python {platform.python_version()} · "
        f"{args.rate:g} items/s offered for {args.minutes:g} min, windows of {args.window:g} s · "
        f"server autovacuum {autovacuum} · tables' storage parameters {options}\n"
    )
    header = (
        "| t (s) | finished msgs / jobs | backlog msgs mean/max | backlog jobs mean/max "
        "| msg p50/p99 ms | job p50/p99 ms | relay / worker µs an item "
        "| blocks a claim's scan reads msg / job | dead rows msg / job "
        "| autovacuums msg / job | RSS MiB relay / worker | fds | connections |"
    )
    if autovacuum == "off":
        print(
            "autovacuum is off on this server: nothing removes the dead entries the "
            "processed rows leave in the due indexes (docs/operations.md, Vacuum)\n"
        )
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    # Counted once: the windows add what they saw finish (a count over millions of
    # finished rows per window would weigh on the run).
    finished_msgs, finished_jobs = conn.execute(FINISHED).fetchone()
    begin = time.monotonic()
    wall_begin = time.time()
    cpu_before = (common.process_cpu([relay.pid]), common.process_cpu([worker.pid]))
    reads_before = index_reads(conn)
    mark = begin
    wall_mark = wall_begin
    while mark - begin < seconds - 1:
        time.sleep(max(0.0, mark + args.window - time.monotonic()))
        now, wall_now = time.monotonic(), time.time()
        cpu = (common.process_cpu([relay.pid]), common.process_cpu([worker.pid]))
        reads = index_reads(conn)
        msg_lat = latencies(conn, MESSAGE_LATENCY, wall_mark, wall_now)
        job_lat = latencies(conn, JOB_LATENCY, wall_mark, wall_now)
        samples = sampler.take(mark)
        tables = table_state(conn)
        finished_msgs += len(msg_lat)
        finished_jobs += len(job_lat)
        (connections,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchone()
        relay_rss, relay_fds = process_state(relay.pid)
        worker_rss, worker_fds = process_state(worker.pid)

        def per_item(name: str, field: int, items: int) -> float:
            return (reads[name][field] - reads_before[name][field]) / max(items, 1)

        jobs_due = ("outbox_job_due_idx", "outbox_job_due_all_idx")
        window = {
            "t": round(now - begin),
            "finished_messages": finished_msgs,
            "finished_jobs": finished_jobs,
            "messages": len(msg_lat),
            "jobs": len(job_lat),
            "backlog_messages_mean": statistics.fmean(s[1] for s in samples) if samples else 0,
            "backlog_messages_max": max((s[1] for s in samples), default=0),
            "backlog_jobs_mean": statistics.fmean(s[2] for s in samples) if samples else 0,
            "backlog_jobs_max": max((s[2] for s in samples), default=0),
            "message_p50_ms": pct(msg_lat, 0.50),
            "message_p99_ms": pct(msg_lat, 0.99),
            "job_p50_ms": pct(job_lat, 0.50),
            "job_p99_ms": pct(job_lat, 0.99),
            "relay_us": (cpu[0] - cpu_before[0]) / max(len(msg_lat), 1) * 1e6,
            "worker_us": (cpu[1] - cpu_before[1]) / max(len(job_lat), 1) * 1e6,
            "msg_index_entries": per_item("outbox_msg_due_idx", 0, len(msg_lat)),
            "msg_index_blocks": per_item("outbox_msg_due_idx", 1, len(msg_lat)),
            "job_index_entries": sum(per_item(n, 0, len(job_lat)) for n in jobs_due),
            "job_index_blocks": sum(per_item(n, 1, len(job_lat)) for n in jobs_due),
            "claim_blocks_messages": claim_blocks(conn, CLAIM_SCANS["messages"]),
            "claim_blocks_jobs": claim_blocks(conn, CLAIM_SCANS["jobs"]),
            "dead_messages": tables["django_outbox_message"][1],
            "dead_jobs": tables["django_outbox_job"][1],
            "autovacuums_messages": tables["django_outbox_message"][2],
            "autovacuums_jobs": tables["django_outbox_job"][2],
            "relay_rss_mib": relay_rss,
            "worker_rss_mib": worker_rss,
            "relay_fds": relay_fds,
            "worker_fds": worker_fds,
            "connections": connections,
        }
        windows.append(window)
        w = window
        print(
            f"| {w['t']} | {w['finished_messages']:,} / {w['finished_jobs']:,} "
            f"| {w['backlog_messages_mean']:.1f} / {w['backlog_messages_max']} "
            f"| {w['backlog_jobs_mean']:.1f} / {w['backlog_jobs_max']} "
            f"| {w['message_p50_ms']:.1f} / {w['message_p99_ms']:.1f} "
            f"| {w['job_p50_ms']:.1f} / {w['job_p99_ms']:.1f} "
            f"| {w['relay_us']:.0f} / {w['worker_us']:.0f} "
            f"| {w['claim_blocks_messages']} / {w['claim_blocks_jobs']} "
            f"| {w['dead_messages']:,} / {w['dead_jobs']:,} "
            f"| {w['autovacuums_messages']} / {w['autovacuums_jobs']} "
            f"| {relay_rss:.0f} / {worker_rss:.0f} | {relay_fds} / {worker_fds} "
            f"| {connections} |",
            flush=True,
        )
        cpu_before, reads_before, mark, wall_mark = cpu, reads, now, wall_now
    produced = [results.get(timeout=60) for _ in producers]
    for process in producers:
        process.join()
    sampler.stop.set()
    stop.set()
    for child in (relay, worker):
        child.terminate()
        child.wait(60)
    transactions = sum(p["transactions"] for p in produced)
    late = sum(p["late"] for p in produced)
    print(
        f"\n{transactions:,} transactions committed ({2 * transactions:,} items); "
        f"{late:,} started over a second late (the producers could not keep the pace)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "windows": windows}, indent=1))
    conn.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
