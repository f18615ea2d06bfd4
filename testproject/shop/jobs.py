"""Background jobs of the test project (``django.tasks`` tasks on our backend).

Written against the Tasks API only (imported through our compat module so the
same file serves Django 6's ``django.tasks`` and the 5.2 backport).
"""

import os
import time
from pathlib import Path

from django_outbox.jobs.compat import task
from testproject.shop.models import Payment


@task()
def add(a, b):
    return a + b


@task()
def noop():
    return None


@task()
def record_payment(order_ref):
    """One Payment per run: the tests count how often a job really ran."""
    Payment.objects.create(order_ref=order_ref, status="job")
    return order_ref


@task(takes_context=True, max_attempts=3, retry_base_seconds=0.2, retry_max_seconds=0.5)
def flaky(context, order_ref, failures):
    """Fails on its first *failures* attempts, then records a Payment."""
    if context.attempt <= failures:
        raise ConnectionError(f"attempt {context.attempt} of {order_ref}: try again")
    Payment.objects.create(order_ref=order_ref, status=f"attempt-{context.attempt}")
    return context.attempt


@task(max_attempts=3, retry_base_seconds=0.1, retry_max_seconds=0.2)
def always_fails(reason):
    raise RuntimeError(reason)


@task(max_attempts=5, dont_retry=(ValueError,))
def refuses(value):
    raise ValueError(f"bad value {value!r}")


@task(unique_key="sync-{customer}")
def sync_customer(customer):
    return customer


@task(queue_name="emails", priority=10)
def send_email(to):
    return to


@task()
def slow(order_ref, seconds, marker=""):
    """Sleeps *seconds*, then records a Payment. With *marker*: only the first run
    sleeps, writing the marker as it starts (crash tests kill it there)."""
    if not marker or not Path(marker).exists():
        if marker:
            Path(marker).write_text(str(os.getpid()))
        time.sleep(seconds)
    Payment.objects.create(order_ref=order_ref, status="slow")
    return order_ref


@task()
def waits_for(order_ref, release, timeout=60.0):
    """Runs until the file *release* exists (or *timeout* seconds pass), then records a
    Payment: a long job whose end the test decides, not a clock."""
    deadline = time.monotonic() + timeout
    while not Path(release).exists():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{release} never appeared")
        time.sleep(0.02)
    Payment.objects.create(order_ref=order_ref, status="released")
    return order_ref


@task(serial_key="order-{order}", max_attempts=1)
def order_step(order, step, fail=False):
    """Steps of one order run one at a time, in order; a failed step holds its order."""
    Payment.objects.create(order_ref=f"{order}:{step}", status="step")
    if fail:
        raise RuntimeError(f"step {step} of {order} failed")
    return step


@task()
def batch_done(batch, tag):
    """A batch's callback: one Payment per call, its counts in the status."""
    Payment.objects.create(
        order_ref=f"batch:{tag}", status=f"{batch['succeeded']}/{batch['failed']}/{batch['total']}"
    )
    return batch


@task(timeout=0.5, max_attempts=2, retry_base_seconds=0.1, retry_max_seconds=0.1)
def too_slow(seconds):
    time.sleep(seconds)
    return "finished"


@task()
async def async_add(a, b):
    return a + b


@task()
def bench_noop():
    """The jobs benchmark's no-op job."""
    return None


@task()
def send_receipt(order_id):
    """The demo's job: a receipt per order, written idempotently (jobs run at least once:
    a worker killed after writing and before recording runs it again)."""
    time.sleep(float(os.environ.get("TESTPROJECT_JOB_DELAY", "0")))
    Payment.objects.get_or_create(order_ref=f"receipt:{order_id}", status="receipt")
    return order_id


@task()
def receipts_done(batch):
    """The demo batch's callback."""
    Payment.objects.create(
        order_ref="receipts-batch",
        status=f"{batch['succeeded']}/{batch['failed']}/{batch['total']}",
    )


@task(serial_key="account-{account}", max_attempts=1)
def ledger_entry(account, n, seconds=0.02):
    """Records when it ran (start and end, this process's clock: one host) so a test can
    check that the entries of one account never overlapped and kept their order."""
    started = time.time()
    time.sleep(seconds)
    Payment.objects.create(
        order_ref=f"{account}:{n}", status=f"{started:.6f}-{time.time():.6f}-{os.getpid()}"
    )
    return n


@task()
def echo(value):
    """Returns its argument as it is (results of different JSON types)."""
    return value


@task(max_attempts=1)
def once(order_ref):
    """A job that must not run twice: one attempt."""
    Payment.objects.create(order_ref=order_ref, status="once")
    return order_ref


@task(max_attempts=3)
def interrupted():
    """Raises KeyboardInterrupt, as Ctrl-C in the worker's terminal would."""
    raise KeyboardInterrupt


@task(serial_key="order-{order}", max_attempts=1, queue_name="emails")
def order_email(order, step):
    """A step of an order's serial key that runs on the emails queue."""
    Payment.objects.create(order_ref=f"{order}:{step}", status="email")
    return step


# The chaos harness (tests/chaos): each run of a job writes one row (order_ref = the
# job's result id), outside the job's record, so a second run shows as a second row.


@task(takes_context=True, max_attempts=20, retry_base_seconds=0.2, retry_max_seconds=1)
def chaos_run(context, tag):
    Payment.objects.create(order_ref=str(context.task_result.id), status=f"chaos-run:{tag}"[:50])
    return tag


@task(takes_context=True, max_attempts=20, retry_base_seconds=0.2, retry_max_seconds=1)
def chaos_flaky(context, tag):
    """Fails its first attempt (a retry), then runs."""
    if context.attempt == 1:
        raise ConnectionError(f"{tag}: first attempt fails")
    Payment.objects.create(order_ref=str(context.task_result.id), status="chaos-flaky")
    return context.attempt


@task(
    takes_context=True,
    serial_key="chaos-{key}",
    max_attempts=20,
    retry_base_seconds=0.2,
    retry_max_seconds=1,
)
def chaos_serial(context, key, n):
    """A serial key's job: its runs' row order is the order run."""
    Payment.objects.create(order_ref=str(context.task_result.id), status="chaos-serial", sequence=n)
    return n


@task(takes_context=True, max_attempts=20, retry_base_seconds=0.2, retry_max_seconds=1)
def chaos_batch_done(context, batch, tag):
    """A batch's callback."""
    Payment.objects.create(
        order_ref=str(context.task_result.id),
        status=f"chaos-batch:{batch['succeeded']}/{batch['total']}",
    )
    return tag
