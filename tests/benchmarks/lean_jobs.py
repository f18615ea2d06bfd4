"""The lean bound of a jobs worker: claim, run, record, written directly with psycopg.

    python -m tests.benchmarks.lean_jobs DSN [--contract]

What any database-backed worker must at least do per batch of no-op jobs, and nothing
more: one ``UPDATE … RETURNING`` over ``FOR UPDATE SKIP LOCKED`` claims up to 500 due
jobs (RUNNING, a lease, the attempt counted), each job's function is found by its path
(looked up once) and called with its arguments, and one ``UPDATE`` records them all
SUCCESSFUL. No framework, no model instances, no per-job statement, no outcome of its
own per job (every no-op returns ``None``), no retries, no heartbeat, no fencing.

With ``--contract`` it also does what Django's Tasks API asks of any backend's worker,
and nothing else: each job's ``TaskResult`` made (Django's class), ``task_started``
sent with it before the call and ``task_finished`` after it with the result as
finished, to the receivers connected (Django's own log the start and the end); the
function is the job's ``Task``, called as ``Task.call`` does. That is the floor of any
Django Tasks backend on this path, ours included.

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


def contract() -> Callable[[str, str, list[Any], dict[str, Any]], None]:
    """A runner of one job as the Tasks API asks: result, signals, ``Task.call``."""
    import dataclasses
    from datetime import UTC, datetime

    import django
    from django.utils.module_loading import import_string

    django.setup()
    from django_outbox.jobs import compat
    from django_outbox.jobs.backend import JobsBackend

    tasks: dict[str, Any] = {}
    started_signal, finished_signal = compat.signals.task_started, compat.signals.task_finished

    def run(job_id: str, path: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        task = tasks.get(path)
        if task is None:
            task = tasks[path] = import_string(path)
        now = datetime.now(UTC)
        result = compat.TaskResult(
            task=task,
            id=job_id,
            status=compat.TaskResultStatus.RUNNING,
            enqueued_at=now,
            started_at=now,
            finished_at=None,
            last_attempted_at=now,
            args=args,
            kwargs=kwargs,
            backend=task.backend,
            errors=[],
            worker_ids=["lean"],
        )
        started_signal.send(sender=JobsBackend, task_result=result)
        value = task.call(*args, **kwargs)
        finished = dataclasses.replace(
            result, status=compat.TaskResultStatus.SUCCESSFUL, finished_at=datetime.now(UTC)
        )
        compat.set_attribute(finished, "_return_value", value)
        finished_signal.send(sender=JobsBackend, task_result=finished)

    return run


def main() -> None:
    conn = psycopg.connect(sys.argv[1], autocommit=True)
    run_job = contract() if "--contract" in sys.argv[2:] else None
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
        if first_cpu is None:
            started = time.process_time()
        done = one_batch(conn, worker, run_job, functions)
        if not done:
            time.sleep(0.05)
            continue
        if first_cpu is None:
            first_cpu = started
        ran += done
        last_cpu = time.process_time()


def one_batch(
    conn: psycopg.Connection[Any],
    worker: uuid.UUID,
    run_job: Callable[[str, str, list[Any], dict[str, Any]], None] | None,
    functions: dict[str, Callable[..., Any]],
) -> int:
    """Claim a batch, run it, record it: the jobs it ran (0: nothing was due)."""
    token = uuid.uuid4()
    with conn.transaction():
        rows = conn.execute(CLAIM, {"token": token, "worker": worker}).fetchall()
    if not rows:
        return 0
    if run_job is not None:
        for job_id, path, args, kwargs in rows:
            run_job(str(job_id), path, args, kwargs)
    else:
        for _, path, args, kwargs in rows:
            function = functions.get(path)
            if function is None:
                function = functions[path] = noop  # every path here is a no-op
            function(*args, **kwargs)
    with conn.transaction():
        conn.execute(RECORD, {"ids": [row[0] for row in rows], "token": token})
    return len(rows)


if __name__ == "__main__":
    main()
