"""Two services and their jobs under faults, as real processes (issue 16, section 2).

Service A (database ``chaos_a_<pid>``) commits business rows with outbox messages
to RabbitMQ, to Redis and over HTTP to service B's webhook, some keyed (``strict``
and ``latest``), and enqueues jobs (retries, serial keys, batches with a callback).
Service B (``chaos_b_<pid>``) consumes, handles with one effect row per message id
in the handler's transaction, replies to requests through its outbox to A's inbox,
and enqueues jobs from its handlers. Every process is supervised (restarted when it
dies); a seeded schedule SIGKILLs processes of every kind, cuts hosts off the
network, restarts Redis and RabbitMQ, terminates the databases' connections and
publishes sent messages again. At the end the invariants are read from both
databases (``tests.chaos.checks``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis

from tests import hosts, services
from tests.chaos import checks
from tests.chaos.processes import ROOT, Process, Supervisor
from tests.chaos.takeover import CutWatch, Reader
from tests.chaos.workload import Plan

PG = os.environ.get("CHAOS_POSTGRES", "postgres://postgres@127.0.0.1:5432")
AMQP = services.AMQP_URL
REDIS_DBS = (11, 12)
#: Our own monitoring connections, spared by the connection terminations.
APPLICATION = "chaos-harness"


@dataclass
class Config:
    messages: int = 20_000
    jobs: int = 5_000
    kills: int = 50
    cuts: int = 3
    seconds: float = 300.0
    seed: int = 1
    producers: int = 3
    cut_min: float = 10.0
    cut_max: float = 30.0
    duplicates: int = 300
    pg_terminations: int = 3
    broker_restarts: bool = True
    pg_restart: bool = True
    #: Windows in which B's webhook server is slow, then answers 503 (one each).
    webhook_faults: bool = True
    webhook_slow_delay: float = 2.0
    #: B's webhook source handles a sender's first attempt in the request
    #: (``HANDLE_IN_REQUEST``): killing B's web server then kills handlers mid-request.
    webhook_in_request: bool = True
    #: Fail if a cut-off host's rows are not all released to others within this (s).
    max_takeover: float | None = None
    #: Seconds after a reconnect at which the rows others finished are compared again.
    fence_wait: float = 5.0
    drain_timeout: float = 300.0
    max_drain: float | None = None
    keep: bool = False
    report: str | None = None


@dataclass
class Fault:
    at: float  # seconds after the start of production
    kind: str
    target: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    started: float | None = None
    ended: float | None = None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _admin() -> psycopg.Connection[Any]:
    return psycopg.connect(f"{PG}/postgres", autocommit=True, application_name=APPLICATION)


class Run:
    """One run of the harness: set up, run with faults, drain, check, restore."""

    def __init__(self, config: Config, log: Callable[[str], None] = print) -> None:
        self.config = config
        self.log = log
        self.rng = random.Random(config.seed)
        self.pid = os.getpid()
        self.plan = Plan(messages=config.messages, jobs=config.jobs)
        self.dbs = {side: f"chaos_{side}_{self.pid}" for side in ("a", "b")}
        self.queues = {
            "b-rabbit": f"chaos-{self.pid}-b-rabbit",
            "a-in": f"chaos-{self.pid}-a-in",
            "b-redis": f"chaos-{self.pid}-b-redis",
        }
        self.dir = ROOT / "var" / f"chaos-{self.pid}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.secret = f"chaos-secret-{self.pid}"
        self.hosts: dict[str, hosts.Host] = {}
        self.processes: list[Process] = []
        self.supervisor: Supervisor | None = None
        self.faults: list[Fault] = []
        self.threads: list[threading.Thread] = []
        self.watches: list[CutWatch] = []
        #: The messages each duplicate round published again, by destination.
        self.duplicated: dict[str, set[str]] = {
            route: set() for route in ("rabbit", "redis", "webhook")
        }
        self.webhook_switch = self.dir / "webhook-faults"
        self.t0 = 0.0

    # Settings -------------------------------------------------------------------

    def settings(self, side: str) -> dict[str, Any]:
        engine = {
            "DISPATCH": "notify",
            "BATCH_SIZE": 200,
            "LEASE_SECONDS": 30.0,
            "RETRY_BASE_SECONDS": 0.25,
            "RETRY_MAX_SECONDS": 2.0,
            "MAX_ATTEMPTS": 1000,
        }
        redis_url = f"redis://127.0.0.1:6379/{REDIS_DBS[0]}"
        if side == "a":
            return {
                **engine,
                "OUTBOX": {
                    "DESTINATIONS": {
                        "rabbit": {
                            "TRANSPORT": "kombu",
                            "URL": AMQP,
                            "QUEUE": self.queues["b-rabbit"],
                            "TIMEOUT": 5,
                        },
                        "redis": {
                            "TRANSPORT": "kombu",
                            "URL": redis_url,
                            "QUEUE": self.queues["b-redis"],
                            "TIMEOUT": 5,
                        },
                        "webhook": {
                            "TRANSPORT": "http",
                            "URL": f"http://127.0.0.1:{self.port}/inbox/webhook/",
                            "SECRET": self.secret,
                            "TIMEOUT": 5,
                        },
                    }
                },
                "INBOX": {
                    "SOURCES": {
                        "b": {
                            "TRANSPORT": "kombu",
                            "URL": AMQP,
                            "QUEUE": self.queues["a-in"],
                            "HEARTBEAT": 10,
                        }
                    }
                },
            }
        return {
            **engine,
            "OUTBOX": {
                "DESTINATIONS": {
                    "a": {"TRANSPORT": "kombu", "URL": AMQP, "QUEUE": self.queues["a-in"]}
                }
            },
            "INBOX": {
                "SOURCES": {
                    "rabbit": {
                        "TRANSPORT": "kombu",
                        "URL": AMQP,
                        "QUEUE": self.queues["b-rabbit"],
                        "HEARTBEAT": 10,
                        "REPLY_TO": "a",
                    },
                    "redis": {
                        "TRANSPORT": "kombu",
                        "URL": redis_url,
                        "QUEUE": self.queues["b-redis"],
                        # A killed or cut-off consumer's messages go back after this long.
                        "LEASE_SECONDS": 5,
                        "REPLY_TO": "a",
                    },
                    "webhook": {
                        "TRANSPORT": "webhook",
                        "SECRET": self.secret,
                        "REPLY_TO": "a",
                        "HANDLE_IN_REQUEST": self.config.webhook_in_request,
                    },
                }
            },
        }

    def env(self, side: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=f"{PG}/{self.dbs[side]}",
            OUTBOX_SETTINGS_JSON=json.dumps(self.settings(side)),
            CELERY_BROKER_URL=f"redis://127.0.0.1:6379/{REDIS_DBS[1]}",
            DEBUG="0",
            PYTHONUNBUFFERED="1",
            TESTPROJECT_VAR_DIR=str(self.dir / side),
        )
        if side == "b":  # the webhook server's slow / 503 switch (absent: normal)
            env["TESTPROJECT_CHAOS_WEBHOOK_FAULTS"] = str(self.webhook_switch)
        return env

    # Set up ---------------------------------------------------------------------

    def setup(self) -> None:
        with _admin() as admin:
            for name in self.dbs.values():
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                admin.execute(f'CREATE DATABASE "{name}"')
        migrations = [
            subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"],
                cwd=ROOT,
                env=self.env(side),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for side in ("a", "b")
        ]
        for process in migrations:
            output, _ = process.communicate(timeout=600)
            if process.returncode:
                raise RuntimeError(f"migrate failed:\n{output}")
        for name in ("arelay", "bconsumer", "bworker"):
            ports = (*hosts.SERVICE_PORTS, self.port) if name == "arelay" else hosts.SERVICE_PORTS
            self.hosts[name] = hosts.Host(name, ports=ports)

    def build(self) -> None:
        manage = [sys.executable, str(ROOT / "manage.py")]
        plan = ["--messages", str(self.config.messages), "--jobs", str(self.config.jobs)]

        def add(name: str, kind: str, side: str, argv: list[str], host: str | None = None,
                once: bool = False) -> None:  # fmt: skip
            self.processes.append(
                Process(
                    name=name,
                    kind=kind,
                    argv=argv,
                    env=self.env(side),
                    log=self.dir / f"{name}.log",
                    host=self.hosts[host] if host else None,
                    once=once,
                )
            )

        # Production goes on over the whole window; every fault ends inside it.
        produce_seconds = self.config.seconds
        for index in range(self.config.producers):
            add(
                f"producer-{index}",
                "producer",
                "a",
                [
                    *(sys.executable, "-m", "tests.chaos.workload", "produce", *plan),
                    *("--index", str(index), "--of", str(self.config.producers)),
                    *("--t0", f"{self.t0:.3f}", "--seconds", str(produce_seconds)),
                ],
                once=True,
            )
        add("relay-a1", "relay-a", "a", [*manage, "outbox_relay"], host="arelay")
        add("relay-a2", "relay-a", "a", [*manage, "outbox_relay"])
        add("consume-a", "consume-a", "a", [*manage, "inbox_consume", "b", "--max-outage", "inf"])
        add("jobs-a", "jobs-a", "a", [*manage, "jobs_worker"])
        consume = ["inbox_consume", "rabbit", "redis", "--max-outage", "inf"]
        add("consume-b1", "consume-b", "b", [*manage, *consume], host="bconsumer")
        add("consume-b2", "consume-b", "b", [*manage, *consume])
        # Served as in production, by gunicorn: Django's runserver answers each request
        # in two writes, and with Nagle's algorithm on its socket and the client's
        # delayed ACK every answer waited 40 ms: one connection carried 20 requests/s.
        # A SIGKILL takes the master; its workers notice and exit within a second, and
        # the restarted master binds beside them (SO_REUSEPORT).
        web = [sys.executable, "-m", "gunicorn", "-w", "2", "-k", "gthread", "--threads", "4"]
        web += ["--reuse-port", "--log-level", "error"]
        web += ["--chdir", str(ROOT), "-b", f"127.0.0.1:{self.port}", "testproject.wsgi"]
        add("web-b", "web-b", "b", web)
        add("inbox-worker-b", "inbox-worker-b", "b", [*manage, "inbox_worker"])
        add("relay-b", "relay-b", "b", [*manage, "outbox_relay"])
        add("jobs-b1", "jobs-b", "b", [*manage, "jobs_worker"], host="bworker")
        add("jobs-b2", "jobs-b", "b", [*manage, "jobs_worker"])

    # The fault schedule ---------------------------------------------------------

    def schedule(self) -> list[Fault]:
        c, rng, span = self.config, self.rng, self.config.seconds
        faults: list[Fault] = []
        kinds = sorted({p.kind for p in self.processes})
        rng.shuffle(kinds)
        # Faults fall in [5 %, 85 %] of the window and end before production does.
        for number in range(c.kills):
            kind = kinds[number] if number < len(kinds) else rng.choice(kinds)
            faults.append(Fault(at=rng.uniform(0.05, 0.85) * span, kind="kill", target=kind))
        names = list(self.hosts)
        slot = 0.8 * span / max(c.cuts, 1)
        cuts: list[tuple[float, float]] = []
        for number in range(c.cuts):
            seconds = rng.uniform(c.cut_min, c.cut_max)
            start = 0.05 * span + slot * number + rng.uniform(0, max(0.0, slot - seconds))
            cuts.append((start, start + seconds))
            faults.append(
                Fault(
                    at=start,
                    kind="cut",
                    target=names[number % len(names)],
                    detail={"seconds": round(seconds, 1)},
                )
            )
        if c.broker_restarts:
            faults.append(Fault(at=rng.uniform(0.2, 0.6) * span, kind="restart", target="redis"))
            faults.append(
                Fault(at=rng.uniform(0.3, 0.75) * span, kind="restart", target="rabbitmq")
            )
        if c.pg_restart:
            # Outside the cuts (their takeover is measured while PostgreSQL answers).
            at = rng.uniform(0.25, 0.7) * span
            for _ in range(200):
                if not any(a - 3 < at < b + 3 for a, b in cuts):
                    break
                at = rng.uniform(0.15, 0.8) * span
            faults.append(Fault(at=at, kind="restart", target="postgres"))
        if c.webhook_faults:
            for kind in ("slow", "unavailable"):
                seconds = rng.uniform(c.cut_min / 2, c.cut_min)
                faults.append(
                    Fault(
                        at=rng.uniform(0.1 * span, 0.85 * span - seconds),
                        kind=kind,
                        target="web-b",
                        detail={"seconds": round(seconds, 1)},
                    )
                )
        for _ in range(c.pg_terminations):
            faults.append(
                Fault(at=rng.uniform(0.1, 0.85) * span, kind="terminate", target="postgres")
            )
        rounds = 3 if c.duplicates else 0
        for number in range(rounds):
            faults.append(
                Fault(
                    at=rng.uniform(0.3, 0.85) * span,
                    kind="duplicate",
                    target="brokers",
                    detail={"count": c.duplicates // rounds, "seed": c.seed * 100 + number},
                )
            )
        return sorted(faults, key=lambda f: f.at)

    def _in_background(self, fault: Fault, work: Callable[[], None]) -> None:
        def run() -> None:
            try:
                work()
            except Exception as exc:  # recorded in the report: a fault that misfired
                fault.detail["error"] = repr(exc)[-400:]
            fault.ended = time.time() - self.t0

        thread = threading.Thread(target=run, name=f"fault-{fault.kind}", daemon=True)
        self.threads.append(thread)
        thread.start()

    def inflict(self, fault: Fault) -> None:
        assert self.supervisor is not None
        fault.started = time.time() - self.t0
        if fault.kind == "kill":
            candidates = [p for p in self.processes if p.kind == fault.target and p.alive]
            if not candidates:  # restarting, or a producer already done: any other
                candidates = [p for p in self.processes if p.alive and not p.once]
            victim = self.rng.choice(candidates)
            fault.detail["process"] = victim.name
            fault.detail["done"] = self.supervisor.kill(victim)
            fault.ended = fault.started
        elif fault.kind == "cut":
            host = self.hosts[fault.target]
            side = "a" if fault.target == "arelay" else "b"
            pids = [p.popen.pid for p in self.processes if p.host is host and p.alive and p.popen]
            watch = CutWatch(
                fault.target,
                pids,
                Reader(f"{PG}/{self.dbs[side]}", APPLICATION),
                clock=lambda: time.time() - self.t0,
                fence_wait=self.config.fence_wait,
            )
            self.watches.append(watch)

            def cut() -> None:
                host.cut()
                try:
                    watch.cut()
                    time.sleep(
                        max(
                            0.0,
                            fault.detail["seconds"]
                            - (time.time() - self.t0 - (fault.started or 0)),
                        )
                    )
                finally:
                    host.reconnect()
                    watch.reconnect()

            self._in_background(fault, cut)
        elif fault.kind == "restart":
            works = {
                "redis": restart_redis,
                "rabbitmq": restart_rabbitmq,
                "postgres": restart_postgres,
            }
            work = works[fault.target]
            self._in_background(fault, lambda: fault.detail.update(work()))
        elif fault.kind in ("slow", "unavailable"):
            line = f"slow {self.config.webhook_slow_delay}" if fault.kind == "slow" else "503"
            fault.detail["switch"] = line

            def degrade() -> None:
                self.webhook_switch.write_text(line)
                try:
                    time.sleep(fault.detail["seconds"])
                finally:
                    self.webhook_switch.unlink(missing_ok=True)

            self._in_background(fault, degrade)
        elif fault.kind == "terminate":
            fault.detail["connections"] = self.terminate()
            fault.ended = time.time() - self.t0
        elif fault.kind == "duplicate":
            self._in_background(fault, lambda: fault.detail.update(self.duplicate(fault)))

    def terminate(self) -> int:
        """Terminate the services' connections (not ours); retried while PostgreSQL
        restarts."""
        deadline = time.time() + 60
        while True:
            try:
                with _admin() as admin:
                    rows = admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = ANY(%s) AND pid <> pg_backend_pid() "
                        "AND application_name <> %s",
                        (list(self.dbs.values()), APPLICATION),
                    ).fetchall()
                return len(rows)
            except psycopg.OperationalError:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)

    def duplicate(self, fault: Fault) -> dict[str, Any]:
        """One round of duplicates; tried again (another sample is not taken: the same
        seed) when the round could not publish, e.g. PostgreSQL or a broker restarting."""
        # Up to about 30 s: PostgreSQL shutting down for its restart may take a while
        # on a loaded machine (CI), and a broker restart as long.
        tries_at_most = 10
        for tries in range(1, tries_at_most + 1):
            try:
                found = self._duplicate_once(fault)
            except RuntimeError:
                if tries == tries_at_most:
                    raise
                time.sleep(3)
                continue
            failed = {route: n for route, n in found["failed"].items() if n}
            if not failed or tries == tries_at_most:
                break
            fault.detail.setdefault("rounds failed", []).append(failed)
            time.sleep(3)  # a broker restarting: publish the round again
        for route, ids in found.pop("ids").items():
            self.duplicated[route].update(ids)
        return found

    def _duplicate_once(self, fault: Fault) -> dict[str, Any]:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "tests.chaos.workload", "duplicate"),
                *("--messages", str(self.config.messages), "--jobs", str(self.config.jobs)),
                *("--count", str(fault.detail["count"]), "--seed", str(fault.detail["seed"])),
            ],
            cwd=ROOT,
            env=self.env("a"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode:
            raise RuntimeError(done.stdout[-200:] + done.stderr[-300:])
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))

    # The run --------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        c = self.config
        started = time.time()
        self.setup()
        self.log(f"chaos: databases {', '.join(self.dbs.values())}; logs in {self.dir}")
        self.t0 = time.time() + 3  # the processes' start-up, before the first unit is due
        self.build()
        self.supervisor = Supervisor(self.processes)
        self.supervisor.start()
        self.faults = self.schedule()
        for fault in self.faults:
            pause = self.t0 + fault.at - time.time()
            if pause > 0:
                time.sleep(pause)
            self.log(f"chaos: {fault.at:6.1f}s {fault.kind} {fault.target}")
            try:
                self.inflict(fault)
            except Exception as exc:
                fault.detail["error"] = repr(exc)
                fault.ended = time.time() - self.t0
        for thread in self.threads:
            thread.join()
        producers = [p for p in self.processes if p.once]
        deadline = time.time() + c.drain_timeout
        while not all(p.finished for p in producers) and time.time() < deadline:
            time.sleep(0.1)
        # Production ended when the last producer exited (seen within 0.1 s).
        produced = max((p.finished_at or time.time()) for p in producers) - self.t0
        last_fault = max((f.ended or f.started or 0.0) for f in self.faults) if self.faults else 0.0
        self.log(f"chaos: production done at {produced:.1f}s, last fault ended {last_fault:.1f}s")
        drained, remaining = self.drain()
        for watch in self.watches:
            watch.join()
        report: dict[str, Any] = {
            "config": asdict(c),
            "plan": {
                "units": len(self.plan.units()),
                "jobs enqueued by A": self.plan.expected_jobs_a(),
                "jobs enqueued by B": self.plan.expected_jobs_b(),
            },
            "production ended (s)": round(produced, 2),
            "last fault ended (s)": round(last_fault, 2),
            "drained (s)": None if drained is None else round(drained, 2),
            "drain after last fault (s)": None
            if drained is None
            else round(max(0.0, drained - max(last_fault, produced)), 2),
            "remaining": {k: v for k, v in remaining.items() if v},
        }
        time.sleep(2)  # anything a process still does after the drain, before the checks
        self.supervisor.stop()
        report["processes"] = {
            p.name: {"starts": p.starts, "killed": p.kills, "exited on their own": p.exits}
            for p in self.processes
        }
        report["faults"] = self.fault_summary()
        report["duplicates suppressed (clean exits only)"] = self.duplicates_from_logs()
        failures: list[str] = []
        report["takeover"] = self.takeover(failures)
        if drained is None:
            failures.append(f"not drained after {c.drain_timeout} s: {report['remaining']}")
        elif c.max_drain is not None and report["drain after last fault (s)"] > c.max_drain:
            failures.append(
                f"drained {report['drain after last fault (s)']} s after the last fault "
                f"(limit {c.max_drain} s)"
            )
        with self.connect("a") as a, self.connect("b") as b:
            report["messages"] = checks.messages(a, b, failures)
            report["jobs A"] = checks.jobs(a, "A", self.plan.expected_jobs_a(), failures)
            report["jobs B"] = checks.jobs(b, "B", self.plan.expected_jobs_b(), failures)
            report["duplicates"] = checks.duplicates(
                b, {route: sorted(ids) for route, ids in self.duplicated.items()}, failures
            )
            depths = report["duplicates"]["left in the brokers"] = self.queue_depths()
            if any(depths.values()):
                failures.append(f"messages left unconsumed in B's queues: {depths}")
            report["expired leases"] = {
                "A": checks.leases(a, "A", failures),
                "B": checks.leases(b, "B", failures),
            }
        report["failures"] = failures
        report["ok"] = not failures
        report["seconds"] = round(time.time() - started, 1)
        return report

    def connect(self, side: str) -> psycopg.Connection[Any]:
        return psycopg.connect(
            f"{PG}/{self.dbs[side]}", autocommit=True, application_name=APPLICATION
        )

    def drain(self) -> tuple[float | None, dict[str, int]]:
        """Seconds after t0 when every invariant's count was reached (polled every
        0.1 s; None: not within the timeout)."""
        deadline = time.time() + self.config.drain_timeout
        remaining: dict[str, int] = {}
        a = b = None
        try:
            while time.time() < deadline:
                try:
                    a = a if a is not None and not a.closed else self.connect("a")
                    b = b if b is not None and not b.closed else self.connect("b")
                    remaining = checks.progress(a, b, self.plan)
                except psycopg.Error as exc:
                    remaining = {f"unreadable: {exc}": 1}
                    for db in (a, b):
                        if db is not None:
                            db.close()
                    a = b = None
                if not any(remaining.values()):
                    return time.time() - self.t0, remaining
                time.sleep(0.1)
            return None, remaining
        finally:
            for db in (a, b):
                if db is not None:
                    db.close()

    def takeover(self, failures: list[str]) -> list[dict[str, Any]]:
        """Per cut: how long until the others had the cut-off host's rows, and whether
        its late writes changed any of them."""
        found = []
        limit = self.config.max_takeover
        for watch in self.watches:
            figures = watch.report()
            found.append(figures)
            where = f"cut of {watch.host} at {watch.cut_at and round(watch.cut_at, 1)} s"
            if watch.error:
                failures.append(f"{where}: could not watch its rows: {watch.error}")
            held = sum(figures["held at the cut"].values())
            released = figures["released after (s)"]
            if held and released is None:
                failures.append(f"{where}: {held} held row(s) never released to the others")
            elif held and limit is not None and released > limit:
                failures.append(f"{where}: released after {released} s (limit {limit} s)")
            if held and figures["finished by others after (s)"] is None:
                failures.append(f"{where}: its held rows were not all finished")
            if watch.changed:
                failures.append(f"{where}: late writes changed finished rows: {watch.changed[:3]}")
        return found

    def queue_depths(self) -> dict[str, int | None]:
        """Messages still in the brokers' queues of B after the run (0: all consumed)."""
        depths: dict[str, int | None] = {}
        try:
            client = redis.Redis(port=6379, db=REDIS_DBS[0])
            depths["redis"] = int(client.llen(self.queues["b-redis"])) + int(client.hlen("unacked"))
            client.close()
        except redis.RedisError:
            depths["redis"] = None
        try:
            import kombu

            with kombu.Connection(AMQP) as connection:
                channel = connection.channel()
                _, count, _ = channel.queue_declare(self.queues["b-rabbit"], passive=True)
                depths["rabbit"] = int(count)
        except Exception:
            depths["rabbit"] = None
        return depths

    def fault_summary(self) -> dict[str, Any]:
        kills = [f for f in self.faults if f.kind == "kill"]
        return {
            "kills": sum(1 for f in kills if f.detail.get("done")),
            "kills by kind": dict(Counter(f.target for f in kills if f.detail.get("done"))),
            "kills missed (process not running)": sum(1 for f in kills if not f.detail.get("done")),
            "cuts": [
                {"host": f.target, "at": round(f.started or 0, 1), **f.detail}
                for f in self.faults
                if f.kind == "cut"
            ],
            "restarts": [
                {"service": f.target, "at": round(f.started or 0, 1), **f.detail}
                for f in self.faults
                if f.kind == "restart"
            ],
            "connections terminated": [
                f.detail.get("connections") for f in self.faults if f.kind == "terminate"
            ],
            "duplicates published": [
                f.detail.get("published", f.detail.get("error"))
                for f in self.faults
                if f.kind == "duplicate"
            ],
            "webhook": [
                {"kind": f.kind, "at": round(f.started or 0, 1), **f.detail}
                for f in self.faults
                if f.kind in ("slow", "unavailable")
            ],
            "timeline": [
                {
                    "kind": f.kind,
                    "target": f.target,
                    "at": round(f.started or f.at, 2),
                    "ended": None if f.ended is None else round(f.ended, 2),
                    **{
                        k: v for k, v in f.detail.items() if k in ("process", "seconds", "down (s)")
                    },
                }
                for f in self.faults
            ],
            "errors": [
                f"{f.kind} {f.target}: {f.detail['error']}"
                for f in self.faults
                if "error" in f.detail
            ],
        }

    def duplicates_from_logs(self) -> int:
        """Duplicates the consumers reported in their exit summaries (killed ones say
        nothing: a lower bound)."""
        total = 0
        for process in self.processes:
            if process.kind.startswith("consume"):
                text = process.log.read_text(errors="replace")
                for line in text.splitlines():
                    if "duplicate(s)" in line:
                        with contextlib.suppress(ValueError, IndexError):
                            total += int(line.split(" duplicate(s)")[0].rsplit(" ", 1)[-1])
        return total

    # Restore --------------------------------------------------------------------

    def restore(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()
        for host in self.hosts.values():
            with contextlib.suppress(Exception):
                host.close()
        wait_for_redis()
        with contextlib.suppress(Exception):
            services.start_rabbitmq_app()
        for queue in (self.queues["b-rabbit"], self.queues["a-in"]):
            with contextlib.suppress(Exception):
                services.delete_rabbitmq_queue(queue)
        for number in REDIS_DBS:
            with contextlib.suppress(Exception):
                client = redis.Redis(port=6379, db=number)
                client.flushdb()
                client.close()
        if not self.config.keep:
            with _admin() as admin:
                for name in self.dbs.values():
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# Broker restarts --------------------------------------------------------------------


def wait_for_redis(timeout: float = 60) -> float:
    """Seconds until Redis answers PING."""
    started = time.monotonic()
    while True:
        try:
            client = redis.Redis(port=6379, socket_timeout=1)
            client.ping()
            client.close()
            return time.monotonic() - started
        except redis.RedisError:
            if time.monotonic() - started > timeout:
                raise
            time.sleep(0.1)


def restart_redis() -> dict[str, Any]:
    """Stop Redis with a save and start it again as it ran (its data kept: what a
    Redis with persistence does; without it, a restart loses every queued message,
    which no outbox can repair)."""
    client = redis.Redis(port=6379)
    config = {
        key: client.config_get(key)[key]
        for key in ("bind", "port", "dir", "logfile", "save", "appendonly", "dbfilename")
    }
    started = time.monotonic()
    with contextlib.suppress(redis.ConnectionError):
        client.shutdown(save=True)
    client.close()
    while True:
        try:
            socket.create_connection(("127.0.0.1", 6379), timeout=0.2).close()
            time.sleep(0.05)
        except OSError:
            break
    argv = ["redis-server", "--daemonize", "yes", "--port", config["port"]]
    argv += ["--bind", *config["bind"].split()]
    argv += ["--save", config["save"], "--appendonly", config["appendonly"]]
    argv += ["--dir", config["dir"], "--dbfilename", config["dbfilename"]]
    if config["logfile"]:
        argv += ["--logfile", config["logfile"]]
    subprocess.run(argv, check=True, capture_output=True)
    wait_for_redis()
    down = time.monotonic() - started
    if not config["save"]:  # it ran without snapshots: leave none behind
        with contextlib.suppress(OSError):
            (Path(config["dir"]) / config["dbfilename"]).unlink()
    return {"down (s)": round(down, 2)}


def restart_rabbitmq() -> dict[str, Any]:
    """``rabbitmqctl stop_app``, a pause, ``start_app``; durable queues and persistent
    messages are kept."""
    started = time.monotonic()
    services.stop_rabbitmq_app()
    time.sleep(2)
    services.start_rabbitmq_app()
    return {"down (s)": round(time.monotonic() - started, 2)}


def restart_postgres() -> dict[str, Any]:
    """Restart this machine's PostgreSQL cluster (``pg_ctlcluster ... restart``: a fast
    shutdown, every connection cut, then a start) and wait until it accepts connections.
    Both services' databases are on it; so is every other user of this machine's
    PostgreSQL, hence once per run, from the harness only."""
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    started = time.monotonic()
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    while True:
        try:
            _admin().close()
            break
        except psycopg.OperationalError:
            if time.monotonic() - started > 120:
                raise
            time.sleep(0.1)
    return {"down (s)": round(time.monotonic() - started, 2)}
