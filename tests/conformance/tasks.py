"""The tasks the conformance suite enqueues: the kinds Django's own test tasks cover
(no-ops, a value, failures of every kind, context, async), written for our backend.

Where Django's test task relies on a failure being final, ours says
``max_attempts=1``: our backend retries by default (three attempts), Django's
immediate backend never does. A worker process imports them by their dotted
path (``tests.conformance.tasks.…``).
"""

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from django_outbox.jobs.compat import TaskContext, task


@task()
def nothing(*args, **kwargs):
    """Returns ``None`` whatever it is given."""
    return None


@task
def nothing_bare(*args, **kwargs):
    """The bare decorator (no parentheses)."""
    return None


@task()
async def nothing_async(*args, **kwargs):
    return None


@task()
def answer():
    return 42


@task()
def echo(*args, **kwargs):
    """Returns what it was called with, as the worker passed it."""
    return {"args": list(args), "kwargs": kwargs, "types": [type(a).__name__ for a in args]}


@task()
def give(value):
    """Returns *value* (tuples stay tuples until the return value is stored)."""
    return tuple(value) if isinstance(value, list) and value[:1] == ["as-tuple"] else value


@task(max_attempts=1)
def raises_value_error():
    raise ValueError("the task raised ValueError")


@task()
def raises_value_error_retried():
    """Django's plain failing task, under our default of three attempts."""
    raise ValueError("the task raised ValueError")


@task(max_attempts=3)
def raises_system_exit():
    raise SystemExit("the task raised SystemExit")


@task(max_attempts=3)
def calls_exit():
    sys.exit(1)


@task()
def raises_keyboard_interrupt():
    raise KeyboardInterrupt("the task raised KeyboardInterrupt")


@task(max_attempts=1)
def raises_nested_exception():
    raise ValueError(ValueError("an exception inside an exception"))


@task(max_attempts=3)
def returns_a_function():
    """Its return value is neither JSON nor picklable."""
    return lambda: True


@task(max_attempts=3)
def returns_bytes():
    return b"raw"


@task(max_attempts=3)
def returns_int_keys():
    return {1: "one"}


@task(takes_context=True)
def own_id(context):
    return context.task_result.id


@task(takes_context=True)
def check_context(context, attempt):
    """Fails unless Django's ``TaskContext`` of attempt *attempt* is passed."""
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt
    return context.attempt


@task(takes_context=True, max_attempts=2, retry_base_seconds=0, retry_max_seconds=0)
def fails_first_attempt(context):
    """Fails on attempt 1, returns the attempt number on attempt 2."""
    if context.attempt == 1:
        raise ConnectionError("first attempt fails")
    return context.attempt


@task(takes_context=True)
def sees_its_task(context):
    """What the job sees of its own task and result."""
    result = context.task_result
    run_after = result.task.run_after
    return {
        "priority": result.task.priority,
        "queue_name": result.task.queue_name,
        "run_after": run_after.isoformat() if run_after else None,
        "backend": result.task.backend,
        "result_backend": result.backend,
        "status": str(result.status),
        "attempts": result.attempts,
        "id": result.id,
    }


@task(takes_context=True)
def refreshes_itself(context):
    """Refreshes its own result from inside (through its task's backend alias)."""
    context.task_result.refresh()
    return str(context.task_result.status)


@task(max_attempts=1, timeout=0.3)
async def async_sleeps_then_writes(seconds, marker):
    """Sleeps *seconds* in the event loop, then writes *marker*."""
    await asyncio.sleep(seconds)
    Path(marker).write_text("ran past its timeout")
    return "finished"


@task(max_attempts=1, timeout=0.3)
async def async_busy_then_writes(seconds, marker):
    """Awaits short sleeps for *seconds*, then writes *marker*."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    Path(marker).write_text("ran past its timeout")
    return "finished"


@task()
async def async_answer():
    await asyncio.sleep(0)
    return 42


@task(max_attempts=2, retry_base_seconds=0, retry_max_seconds=0)
def kills_its_worker():
    """Every attempt kills the process that runs it (a poison job)."""
    os.kill(os.getpid(), signal.SIGKILL)


@task()
def sleeps(seconds):
    time.sleep(seconds)
    return seconds
