"""The Celery tasks that take a delivery in (``django_outbox.receive``, and the periodic
jobs' ``django_outbox.enqueue_job``) acknowledge it only once they have run: a real
prefork worker whose child is SIGKILLed before the store commits gets the message
again, and it is stored and handled exactly once; a database that cannot be reached
gives the delivery back instead of acknowledging a failure.

How a child is caught before its commit, with no hook in the code: the test holds
a SHARE lock on the inbox table from a connection of its own, so the child's INSERT
waits for it; PostgreSQL's ``pg_blocking_pids`` says when it does.
"""

import os
import signal
import uuid

import psycopg
import pytest
from celery import current_app
from django.db import connection

from django_outbox.inbox.tasks import TASK_SOURCE
from django_outbox.jobs.models import Job
from django_outbox.models import InboxMessage, InboxState
from testproject.shop.models import Payment
from tests import conftest
from tests.acceptance.helpers import CeleryWorker as Worker
from tests.acceptance.helpers import wait_for
from tests.proxy import TcpProxy

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.processes,
]


@pytest.fixture
def worker(queue_name):
    started = []

    def start(**env):
        started.append(Worker(queue_name, **env))
        return started[-1]

    yield start
    for process in started:
        process.stop()


class TableLock:
    """A SHARE lock on the inbox table, held by a connection of the test's own: every
    INSERT into the table waits until ``release()``."""

    def __init__(self):
        params = connection.settings_dict
        self.connection = psycopg.connect(
            host=params.get("HOST") or "127.0.0.1",
            port=params.get("PORT") or 5432,
            user=params.get("USER") or "postgres",
            dbname=params["NAME"],
        )
        self.connection.execute("LOCK TABLE django_outbox_inbox IN SHARE MODE")
        self.pid = self.connection.info.backend_pid

    def waiting(self):
        """Backends that wait for this lock."""
        with psycopg.connect(self.connection.info.dsn, autocommit=True) as probe:
            rows = probe.execute(
                "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                [self.pid],
            ).fetchall()
        return [pid for (pid,) in rows]

    def release(self):
        if not self.connection.closed:
            self.connection.rollback()
            self.connection.close()


@pytest.fixture
def table_lock():
    locks = []

    def take():
        locks.append(TableLock())
        return locks[-1]

    yield take
    for lock in locks:
        lock.release()


def kill_the_child_inside_its_insert(worker, lock):
    """Wait until the worker's child waits on *lock* (inside the task, before its
    commit), SIGKILL it, let the pool notice, then release the lock."""
    try:
        wait_for(lock.waiting, timeout=60, what="the worker's child to wait on the lock")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the worker said:\n{worker.output()[-3000:]}") from None
    [child] = worker.children()
    os.kill(child, signal.SIGKILL)
    wait_for(
        lambda: worker.said("exited with 'signal 9 (SIGKILL)'"),
        timeout=30,
        what="the pool to see its child die",
    )
    lock.release()


def test_a_receive_task_whose_child_is_killed_before_the_store_commits_is_delivered_again(
    configure_outbox, queue_name, worker, table_lock
):
    configure_outbox(INBOX={"SOURCES": {"peer": {"TRANSPORT": "celery", "QUEUE": queue_name}}})
    celery = worker()
    lock = table_lock()
    message_id = str(uuid.uuid4())
    # What another service's outbox sends through its celery transport.
    current_app.send_task(
        "django_outbox.receive",
        args=[{"order": "killed-before-commit"}],
        task_id=message_id,
        headers={"outbox-message-id": message_id, "outbox-type": "payment.captured"},
        queue=queue_name,
    )
    kill_the_child_inside_its_insert(celery, lock)
    try:
        wait_for(
            lambda: InboxMessage.objects.filter(state=InboxState.HANDLED).exists(),
            timeout=30,
            what="the delivery to come again and be handled",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the worker said:\n{celery.output()[-3000:]}") from None
    celery.stop()
    assert InboxMessage.objects.get().message_id == message_id
    assert Payment.objects.filter(order_ref="killed-before-commit").count() == 1


def test_a_receive_task_whose_child_is_killed_inside_the_handler_is_handled_once(
    configure_outbox, queue_name, tmp_path
):
    """Killed after the store committed, inside the handler: the delivery comes again,
    finds the message stored and not handled, and wakes the handlers (DISPATCH)
    instead of running the handler itself."""
    configure_outbox(
        INBOX={"SOURCES": {"peer": {"TRANSPORT": "celery", "QUEUE": queue_name}}},
        DISPATCH="celery",
    )
    marker = tmp_path / "in-handler"
    # The inbox's trigger goes to Celery's default queue: this worker reads it too.
    celery = Worker(f"{queue_name},celery", TESTPROJECT_FREEZE_IN_HANDLER=str(marker))
    try:
        message_id = str(uuid.uuid4())
        current_app.send_task(
            "django_outbox.receive",
            args=[{"order": "killed-in-handler"}],
            task_id=message_id,
            headers={"outbox-message-id": message_id, "outbox-type": "payment.captured"},
            queue=queue_name,
        )
        wait_for(marker.exists, timeout=60, what="the handler to start")
        [child] = celery.children()
        os.kill(child, signal.SIGKILL)
        wait_for(
            lambda: InboxMessage.objects.filter(state=InboxState.HANDLED).exists(),
            timeout=30,
            what="the message to be handled after all",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the worker said:\n{celery.output()[-3000:]}") from None
    finally:
        celery.stop()
    assert InboxMessage.objects.get().message_id == message_id
    assert Payment.objects.filter(order_ref="killed-in-handler").count() == 1


@pytest.mark.jobs
def test_a_periodic_tick_whose_child_is_killed_before_it_commits_enqueues_its_job_once(
    queue_name, worker, table_lock
):
    celery = worker()
    lock = table_lock()
    tick = f"tick-{uuid.uuid4()}"
    # What beat sends for an entry built by django_outbox.jobs.periodic.periodic().
    current_app.send_task(
        "django_outbox.enqueue_job",
        args=["testproject.shop.jobs.record_payment", ["tick"], {}],
        task_id=tick,
        queue=queue_name,
    )
    kill_the_child_inside_its_insert(celery, lock)
    try:
        wait_for(
            lambda: InboxMessage.objects.filter(source=TASK_SOURCE, message_id=tick).exists(),
            timeout=30,
            what="the tick to come again and enqueue its job",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the worker said:\n{celery.output()[-3000:]}") from None
    celery.stop()
    assert Job.objects.filter(task_path="testproject.shop.jobs.record_payment").count() == 1


def test_a_receive_task_that_cannot_reach_the_database_gives_the_delivery_back(
    configure_outbox, queue_name, worker
):
    """With acks_late, Celery acknowledges a task that raised: the task must give the
    delivery back itself while the database is away."""
    configure_outbox(INBOX={"SOURCES": {"peer": {"TRANSPORT": "celery", "QUEUE": queue_name}}})
    proxy = TcpProxy(("127.0.0.1", 5432))  # down: the worker's database is unreachable
    database = conftest.test_database_url().replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    celery = worker(DATABASE_URL=database)
    message_id = str(uuid.uuid4())
    current_app.send_task(
        "django_outbox.receive",
        args=[{"order": "database-away"}],
        task_id=message_id,
        headers={"outbox-message-id": message_id, "outbox-type": "payment.captured"},
        queue=queue_name,
    )
    try:
        # The task gave up on the database: it gave the delivery back (or, before the
        # fix, failed, and Celery acknowledged it).
        wait_for(
            lambda: celery.said("goes back to the queue") or celery.said("raised unexpected"),
            timeout=60,
            what="the task to give up on the unreachable database",
        )
        proxy.up()
        wait_for(
            lambda: InboxMessage.objects.filter(state=InboxState.HANDLED).exists(),
            timeout=30,
            what="the delivery to be stored and handled once the database is back",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the worker said:\n{celery.output()[-3000:]}") from None
    finally:
        celery.stop()
        proxy.down()
    assert InboxMessage.objects.get().message_id == message_id
    assert Payment.objects.filter(order_ref="database-away").count() == 1
    assert celery.said("goes back to the queue")
