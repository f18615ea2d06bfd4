"""The lean bound of a jobs worker: claim, run, record, written directly with psycopg.

    python -m tests.benchmarks.lean_jobs DSN

What any database-backed worker must at least do per batch of no-op jobs, and nothing
more: one ``UPDATE … RETURNING`` over ``FOR UPDATE SKIP LOCKED`` claims up to 500 due
jobs (RUNNING, a lease, the attempt counted), each job's function is found by its path
(looked up once) and called with its arguments, and one ``UPDATE`` records them all
SUCCESSFUL. No framework, no model instances, no per-job statement, no outcome of its
own per job (every no-op returns ``None``), no retries, no heartbeat, no fencing.

It polls every 0.05 s like ``jobs_worker --interval 0.05``. On SIGTERM it prints one JSON
line: the jobs it ran and the CPU seconds it spent from its first non-empty claim to
its last record (start-up and idle polling left out).
"""

from __future__ import annotations

import json
import signal
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

CLAIM = """
UPDATE django_outbox_job AS job
SET state = 'RUNNING', lock_token = %(token)s, claimed_by = %(worker)s,
    locked_until = now() + interval '60 seconds', attempts = job.attempts + 1,
    started_at = now(), last_attempted_at = now()
WHERE job.id IN (
    SELECT id FROM django_outbox_job
    WHERE state = 'READY' AND NOT blocked AND available_at <= now()
    ORDER BY priority DESC, available_at, id
    LIMIT 500 FOR UPDATE SKIP LOCKED)
RETURNING job.id, job.task_path, job.args, job.kwargs
"""

RECORD = """
UPDATE django_outbox_job
SET state = 'SUCCESSFUL', finished_at = now(), locked_until = NULL, lock_token = NULL
WHERE id = ANY(%(ids)s) AND lock_token = %(token)s
"""


def noop(*args: Any, **kwargs: Any) -> None:
    return None


def main() -> None:
    conn = psycopg.connect(sys.argv[1], autocommit=True)
    worker = uuid.uuid4()
    functions: dict[str, Callable[..., Any]] = {}
    ran = 0
    first_cpu: float | None = None
    last_cpu = 0.0

    def stop(*_: Any) -> None:
        spent = last_cpu - first_cpu if first_cpu is not None else 0.0
        print(json.dumps({"jobs": ran, "cpu": spent}), flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        token = uuid.uuid4()
        with conn.transaction():
            rows = conn.execute(CLAIM, {"token": token, "worker": worker}).fetchall()
        if not rows:
            time.sleep(0.05)
            continue
        if first_cpu is None:
            first_cpu = time.process_time()
        for _, path, args, kwargs in rows:
            function = functions.get(path)
            if function is None:
                function = functions[path] = noop  # every path here is a no-op
            function(*args, **kwargs)
        with conn.transaction():
            conn.execute(RECORD, {"ids": [row[0] for row in rows], "token": token})
        ran += len(rows)
        last_cpu = time.process_time()


if __name__ == "__main__":
    main()
