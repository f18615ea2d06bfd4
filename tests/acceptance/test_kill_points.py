"""Deterministic kill points: a real process SIGKILLs itself at one named step
(``DJANGO_OUTBOX_KILL_AT``, ``django_outbox.engine.faults``), then a survivor or the
sweep takes over, and what follows is checked in the database and at the broker.

One test per step where a process can die; docs/reliability.md ("Kill points") lists
them with the outcome each test proves.
"""

import json
import signal
import subprocess
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from kombu import Connection

import django_outbox
from django_outbox.engine import faults
from django_outbox.engine.runner import Runner
from django_outbox.jobs import batch
from django_outbox.jobs.maintenance import sweep as sweep_jobs
from django_outbox.jobs.models import Job, JobBatch, JobState
from django_outbox.models import InboxMessage, InboxState, OutboxMessage, OutboxState
from django_outbox.outbox.maintenance import sweep as sweep_outbox
from testproject.shop import jobs
from testproject.shop.models import Payment
from tests.acceptance.helpers import finish, kombu_ids_in_redis, start_command, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.kill_point,
    pytest.mark.row_locks,
    pytest.mark.processes,
]

#: Short enough for a fast test, long enough for a loaded two-core machine.
LEASE = 2.0
TIMINGS = {
    "LEASE_SECONDS": LEASE,
    "HEARTBEAT_SECONDS": 0.5,
    "WORKER_TIMEOUT_SECONDS": 2.0,
    "JOBS": {"LEASE_SECONDS": 1.0},
}


def killed_at(point: str, tmp_path: Path, *command: str, nth: int = 1) -> str:
    """Run ``manage.py *command`` armed at *point* (the *nth* time it is reached); return
    its output once it has died there, by its own SIGKILL."""
    assert point in faults.POINTS
    marker = tmp_path / f"killed-{uuid.uuid4().hex[:6]}"
    process = start_command(
        *command, DJANGO_OUTBOX_KILL_AT=f"{point}@{nth}", DJANGO_OUTBOX_KILL_MARKER=str(marker)
    )
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"{command[0]} never reached {point}:\n{finish(process, signal.SIGKILL)}"
        ) from None
    output = finish(process)
    assert process.returncode == -signal.SIGKILL, output
    assert marker.read_text().startswith(f"{point}@{nth} "), output
    return output


def survivor(*command: str, until, what: str, timeout: float = 60) -> str:
    """Run ``manage.py *command`` (unarmed) until *until* holds; return its output."""
    process = start_command(*command)
    try:
        wait_for(until, timeout=timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the survivor said:\n{finish(process)}") from None
    return finish(process)


def until_idle(*command: str) -> str:
    """Run ``manage.py *command`` (unarmed) until it exits by itself; return its output."""
    process = start_command(*command)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{command[0]} did not exit:\n{finish(process)}") from None
    output = finish(process)
    assert process.returncode == 0, output
    return output


def summary(output: str) -> dict[str, int]:
    """The JSON summary a ``--json`` command prints last."""
    return json.loads(output.strip().splitlines()[-1])


def after_the_lease() -> datetime:
    """A moment when the killed relay's lease has run out."""
    return timezone.now() + timedelta(seconds=LEASE + 1)


# -- outbox relay --------------------------------------------------------------------------


@pytest.fixture
def redis_destinations(configure_outbox, redis_url):
    """``configure(policy, *names)``: kombu destinations on Redis queues of their own,
    each with the UNCERTAIN policy *policy*; returns {name: queue}."""

    def configure(policy: str, *names: str) -> dict[str, str]:
        queues = {name: f"kill-{name}-{uuid.uuid4().hex[:8]}" for name in names}
        configure_outbox(
            DESTINATIONS={
                name: {"TRANSPORT": "kombu", "URL": redis_url, "QUEUE": queue, "UNCERTAIN": policy}
                for name, queue in queues.items()
            },
            **TIMINGS,
        )
        return queues

    return configure


RELAY = ("outbox_relay", "--no-listen", "--interval", "0.1")


@pytest.mark.redis
@pytest.mark.parametrize("policy", ["resend", "hold"])
def test_relay_killed_before_publishing(redis_destinations, redis_url, tmp_path, policy):
    """Declared, never published: the relay cannot know that, so the rows are uncertain
    like any attempt cut short, resent or held per the destination's policy."""
    queue = redis_destinations(policy, "default")["default"]
    ids = [str(django_outbox.send("order.created", {"n": n}, key="o1").message_id) for n in (1, 2)]

    killed_at("outbox.before_publish", tmp_path, *RELAY)

    assert kombu_ids_in_redis(redis_url, queue) == []
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {OutboxState.SENDING}
    counts = sweep_outbox(now=after_the_lease(), time_budget=5)
    rows = list(OutboxMessage.objects.order_by("sequence"))
    if policy == "resend":
        assert (counts["resent"], counts["sent"]) == (2, 2)
        assert {(r.state, r.attempts) for r in rows} == {(OutboxState.SENT, 2)}
        assert all("outcome uncertain" in r.last_error for r in rows)
    else:
        assert (counts["held"], counts["sent"]) == (2, 0)
        assert {(r.state, r.uncertain) for r in rows} == {(OutboxState.SEND_ERROR, True)}
        assert kombu_ids_in_redis(redis_url, queue) == []
        assert OutboxMessage.objects.requeue() == 2  # the operator found nothing downstream
        assert sweep_outbox(time_budget=5)["sent"] == 2
    # Nothing lost, and sent once: it never left before the kill.
    assert kombu_ids_in_redis(redis_url, queue) == ids


@pytest.mark.redis
@pytest.mark.parametrize("policy", ["resend", "hold"])
def test_relay_killed_after_publishing_before_recording(
    redis_destinations, redis_url, tmp_path, policy
):
    queue = redis_destinations(policy, "default")["default"]
    ids = [str(django_outbox.send("order.created", {"n": n}, key="o1").message_id) for n in (1, 2)]

    killed_at("outbox.before_record", tmp_path, *RELAY)

    assert kombu_ids_in_redis(redis_url, queue) == ids  # at the broker, "sending" here
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {OutboxState.SENDING}
    counts = sweep_outbox(now=after_the_lease(), time_budget=5)
    rows = list(OutboxMessage.objects.order_by("sequence"))
    if policy == "resend":
        assert (counts["resent"], counts["sent"]) == (2, 2)
        assert {r.state for r in rows} == {OutboxState.SENT}
        # At-least-once: sent twice, in key order each time.
        assert kombu_ids_in_redis(redis_url, queue) == ids + ids
    else:
        assert (counts["held"], counts["sent"]) == (2, 0)
        assert {(r.state, r.uncertain) for r in rows} == {(OutboxState.SEND_ERROR, True)}
        assert kombu_ids_in_redis(redis_url, queue) == ids  # held: not sent again


@pytest.mark.redis
@pytest.mark.parametrize("policy", ["resend", "hold"])
def test_relay_killed_between_two_records_of_a_batch(
    redis_destinations, redis_url, tmp_path, policy
):
    """One batch, two destinations, recorded one after the other: killed after the
    first is recorded, the second was never started. It goes back uncounted and is
    sent once, not held, whatever the policy; the first is not sent again."""
    queues = redis_destinations(policy, "first", "second")
    ids: dict[str, list[str]] = {name: [] for name in queues}
    for n, name in enumerate(("first", "second", "first", "second")):
        ids[name].append(str(django_outbox.send("order.created", {"n": n}, to=name).message_id))

    killed_at("outbox.after_record", tmp_path, *RELAY, "--batch", "10")

    states = {
        name: set(OutboxMessage.objects.filter(destination=name).values_list("state", "attempts"))
        for name in queues
    }
    recorded = next(name for name, state in states.items() if state == {(OutboxState.SENT, 1)})
    (other,) = set(queues) - {recorded}
    assert states[other] == {(OutboxState.SENDING, 0)}  # claimed, never started
    assert kombu_ids_in_redis(redis_url, queues[recorded]) == ids[recorded]
    assert kombu_ids_in_redis(redis_url, queues[other]) == []

    counts = sweep_outbox(now=after_the_lease(), time_budget=5)
    assert (counts["resent"], counts["held"], counts["sent"]) == (2, 0, 2)
    rows = OutboxMessage.objects.all()
    assert {(r.state, r.attempts, r.last_error) for r in rows} == {(OutboxState.SENT, 1, "")}
    for name, queue in queues.items():
        assert kombu_ids_in_redis(redis_url, queue) == ids[name]  # each exactly once


@pytest.mark.rabbitmq
@pytest.mark.parametrize("policy", ["resend", "hold"])
def test_relay_killed_with_batches_handed_to_rabbitmq_and_unrecorded(
    configure_outbox, amqp_url, queue_name, tmp_path, policy
):
    """With RabbitMQ's confirms the relay hands the next batches over before it records
    batch N (``Runner.waiting_batches`` of them, 2 by default), so several batches are
    started and unrecorded at once, and the worker's row names only the last one's
    starts. Killed just before recording N, every one of those batches' attempts must
    still count: each batch's rows were marked started when it began to wait. All of
    them are uncertain (resent or held per the policy), the two messages behind them
    (claimed or not, never started) are sent once with their attempt uncounted, and
    none is lost."""
    from tests.integration.test_kombu_transport import drain_queue

    configure_outbox(
        DESTINATIONS={
            "default": {
                "TRANSPORT": "kombu",
                "URL": amqp_url,
                "QUEUE": queue_name,
                "UNCERTAIN": policy,
            }
        },
        **TIMINGS,
    )
    waiting = Runner.waiting_batches
    assert waiting >= 1  # the default overlaps
    count = 2 * (waiting + 3)
    ids = [str(django_outbox.send("order.created", {"n": n}).message_id) for n in range(count)]

    # Batch 1 is recorded (the first record), batches 2 to waiting + 2 are handed over,
    # and the relay dies recording batch 2 (the second).
    killed_at("outbox.before_record", tmp_path, *RELAY, "--batch", "2", nth=2)

    rows = {str(r.message_id): r for r in OutboxMessage.objects.all()}
    assert {(rows[i].state, rows[i].attempts) for i in ids[:2]} == {(OutboxState.SENT, 1)}
    handed = ids[2 : 2 + 2 * (waiting + 1)]
    behind = ids[len(handed) + 2 :]
    assert len(behind) == 2
    assert {(rows[i].state, rows[i].attempt_open) for i in handed} == {(OutboxState.SENDING, True)}
    at_broker = [m.headers["outbox-message-id"] for m in drain_queue(amqp_url, queue_name)]
    assert ids[:4] == at_broker[:4]  # batch 2's confirms had come in
    assert set(at_broker) <= set(ids[:2] + handed)
    # The claimer may have taken the last batch too (never started: not marked).
    left = {(rows[i].state, rows[i].attempt_open, rows[i].attempts) for i in behind}
    assert left <= {(OutboxState.SENDING, False, 0), (OutboxState.SHOULD_BE_SENT, False, 0)}
    given_back = sum(rows[i].state == OutboxState.SENDING for i in behind)

    counts = sweep_outbox(now=after_the_lease(), time_budget=5)
    rows = {str(r.message_id): r for r in OutboxMessage.objects.all()}
    if policy == "resend":
        assert (counts["resent"], counts["held"], counts["sent"]) == (
            len(handed) + given_back,
            0,
            len(handed) + len(behind),
        )
        assert {(rows[i].state, rows[i].attempts) for i in handed} == {(OutboxState.SENT, 2)}
    else:
        assert (counts["resent"], counts["held"], counts["sent"]) == (
            given_back,
            len(handed),
            len(behind),
        )
        assert {(rows[i].state, rows[i].uncertain) for i in handed} == {
            (OutboxState.SEND_ERROR, True)
        }
    # Claimed behind them, never started: sent once, their attempt their first.
    assert {(rows[i].state, rows[i].attempts) for i in behind} == {(OutboxState.SENT, 1)}
    again = [m.headers["outbox-message-id"] for m in drain_queue(amqp_url, queue_name)]
    expected = handed + behind if policy == "resend" else behind
    assert sorted(again) == sorted(expected)


# -- inbox ---------------------------------------------------------------------------------


@pytest.fixture
def rabbitmq_source(configure_outbox, amqp_url, queue_name):
    configure_outbox(
        INBOX={"SOURCES": {"shop": {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": queue_name}}},
        **TIMINGS,
    )
    with Connection(amqp_url) as connection:
        connection.SimpleQueue(queue_name).close()  # declared before anything is published
    return amqp_url, queue_name


def publish_payments(source, count: int) -> None:
    url, queue = source
    with Connection(url) as connection:
        producer = connection.Producer()
        for n in range(count):
            producer.publish(
                {"order": f"p{n}"},
                routing_key=queue,
                serializer="json",
                headers={"outbox-message-id": f"m-{n}", "outbox-type": "payment.captured"},
            )


CONSUME = ("inbox_consume", "--json", "--batch", "10")
INBOX_WORKER = ("inbox_worker", "--no-listen", "--interval", "0.1")


def handled() -> int:
    return InboxMessage.objects.filter(state=InboxState.HANDLED).count()


def handled_each_once(count: int) -> None:
    assert InboxMessage.objects.count() == count
    assert handled() == count
    refs = list(Payment.objects.values_list("order_ref", flat=True))
    assert sorted(refs) == sorted(f"p{n}" for n in range(count))  # each effect exactly once


@pytest.mark.rabbitmq
def test_consumer_killed_after_storing_before_acking(rabbitmq_source, tmp_path):
    publish_payments(rabbitmq_source, 5)

    killed_at("inbox.before_ack", tmp_path, *CONSUME, "--no-handle")

    stored = InboxMessage.objects.count()
    assert stored >= 1  # committed, never acknowledged
    assert not Payment.objects.exists()
    output = survivor(*CONSUME, "--until-idle", "2", until=lambda: handled() == 5, what="5")
    assert summary(output)["duplicates"] >= stored  # redelivered, recognised
    handled_each_once(5)


@pytest.fixture
def redis_source(configure_outbox, redis_url, queue_name):
    """A Redis source whose consumers' leases run out 1 s after their last renewal."""
    configure_outbox(
        INBOX={
            "SOURCES": {
                "shop": {
                    "TRANSPORT": "kombu",
                    "URL": redis_url,
                    "QUEUE": queue_name,
                    "LEASE_SECONDS": 1.0,
                }
            }
        },
        **TIMINGS,
    )
    return redis_url, queue_name


def redis_lists(url: str, queue: str) -> dict[str, int]:
    import redis

    client = redis.Redis.from_url(url)
    lists = {queue: client.llen(queue)}
    for key in client.scan_iter(match=f"{queue}:processing:*"):
        lists[key.decode()] = client.llen(key)
    return lists


@pytest.mark.redis
def test_redis_consumer_killed_after_taking_before_storing(redis_source, tmp_path):
    """The messages it took are in its processing list, not lost in flight: once its
    lease runs out, the survivor moves them back and handles each once."""
    publish_payments(redis_source, 5)

    killed_at("inbox.after_take", tmp_path, *CONSUME)

    assert not InboxMessage.objects.exists()
    url, queue = redis_source
    left = redis_lists(url, queue)
    assert sum(n for key, n in left.items() if key != queue) >= 1, left  # taken, kept
    output = survivor(*CONSUME, "--until-idle", "3", until=lambda: handled() == 5, what="5")
    assert summary(output)["received"] == 5
    handled_each_once(5)
    assert set(redis_lists(url, queue).values()) == {0}  # nothing left anywhere


@pytest.mark.redis
def test_redis_consumer_killed_after_storing_before_acking(redis_source, tmp_path):
    publish_payments(redis_source, 5)

    killed_at("inbox.before_ack", tmp_path, *CONSUME, "--no-handle")

    stored = InboxMessage.objects.count()
    assert stored >= 1  # committed, still in the processing list
    url, queue = redis_source
    # The stored rows may be handled (as due rows) before the dead consumer's lease runs
    # out: the survivor runs until its processing list was moved back, too.
    output = survivor(
        *CONSUME,
        "--until-idle",
        "3",
        until=lambda: handled() == 5 and set(redis_lists(url, queue).values()) == {0},
        what="5 handled and nothing left in any list",
    )
    assert summary(output)["duplicates"] >= stored  # moved back, recognised
    handled_each_once(5)


@pytest.mark.rabbitmq
def test_consumer_killed_inside_a_handler_before_its_commit(rabbitmq_source, tmp_path):
    """inbox_consume stores and handles a batch in one transaction: the rows and the
    handler's effects die with it, and the broker delivers the batch again."""
    publish_payments(rabbitmq_source, 5)

    killed_at("inbox.before_commit", tmp_path, *CONSUME)

    assert not InboxMessage.objects.exists()
    assert not Payment.objects.exists()
    output = survivor(*CONSUME, "--until-idle", "2", until=lambda: handled() == 5, what="5")
    assert summary(output)["received"] == 5  # every message redelivered
    handled_each_once(5)


@pytest.mark.rabbitmq
def test_worker_killed_inside_a_handler_of_stored_messages_before_its_commit(
    rabbitmq_source, tmp_path
):
    """Stored messages are claimed (the attempt counted, committed), then handled in a
    transaction that dies with the worker: the survivor's heartbeat finds it dead and
    the messages are handled once, their killed attempt counted."""
    publish_payments(rabbitmq_source, 5)
    summary(until_idle(*CONSUME, "--no-handle", "--until-idle", "1"))
    assert InboxMessage.objects.count() == 5

    killed_at("inbox.before_commit", tmp_path, *INBOX_WORKER)

    assert handled() == 0
    assert not Payment.objects.exists()  # rolled back
    assert set(InboxMessage.objects.values_list("attempts", flat=True)) == {1}
    survivor(*INBOX_WORKER, until=lambda: handled() == 5, what="the dead worker's claims handled")
    handled_each_once(5)
    assert set(InboxMessage.objects.values_list("attempts", flat=True)) == {2}


@pytest.mark.rabbitmq
def test_consumer_killed_after_the_handlers_commit_before_acking(rabbitmq_source, tmp_path):
    publish_payments(rabbitmq_source, 5)

    killed_at("inbox.before_ack", tmp_path, *CONSUME)

    stored = InboxMessage.objects.count()
    assert stored >= 1
    assert handled() == stored  # handled and committed with their effects
    assert Payment.objects.count() == stored
    # Whatever the killed consumer had not taken comes too: it exits once all is done.
    counts = summary(until_idle(*CONSUME, "--until-idle", "2"))
    assert counts["duplicates"] >= stored  # redelivered, suppressed
    assert counts["received"] == 5
    handled_each_once(5)
    assert set(InboxMessage.objects.values_list("attempts", flat=True)) == {1}


# -- jobs ----------------------------------------------------------------------------------

WORKER = ("jobs_worker", "--json", "--no-listen", "--interval", "0.1")


def finished_jobs() -> int:
    return Job.objects.filter(state__in=(JobState.SUCCESSFUL, JobState.FAILED)).count()


@pytest.mark.jobs
def test_worker_killed_inside_a_job(configure_outbox, tmp_path):
    configure_outbox(**TIMINGS)
    result = jobs.record_payment.enqueue("in-job")

    killed_at("jobs.in_job", tmp_path, *WORKER)

    assert Job.objects.get().state == JobState.RUNNING
    assert not Payment.objects.exists()
    survivor(*WORKER, until=finished_jobs, what="the survivor to run the job again")
    result.refresh()
    assert (result.status, result.attempts, result.return_value) == ("SUCCESSFUL", 2, "in-job")
    assert [e.exception_class_path for e in result.errors] == ["django_outbox.jobs.WorkerLost"]
    assert Payment.objects.filter(order_ref="in-job").count() == 1  # the killed run did nothing


@pytest.mark.jobs
@pytest.mark.parametrize(
    ("task", "argument", "ref", "effects"),
    [
        (jobs.record_payment, "after-run", "after-run", 2),  # at-least-once: it ran twice
        (jobs.send_receipt, 7, "receipt:7", 1),  # an idempotent job: one effect all the same
    ],
    ids=["rerun", "idempotent"],
)
def test_worker_killed_after_a_job_ran_before_its_outcome_is_recorded(
    configure_outbox, tmp_path, task, argument, ref, effects
):
    configure_outbox(**TIMINGS)
    result = task.enqueue(argument)

    killed_at("jobs.before_record", tmp_path, *WORKER)

    assert Job.objects.get().state == JobState.RUNNING  # its effect is committed, not its end
    assert Payment.objects.filter(order_ref=ref).count() == 1
    survivor(*WORKER, until=finished_jobs, what="the survivor to run the job again")
    result.refresh()
    assert (result.status, result.attempts) == ("SUCCESSFUL", 2)
    assert [e.exception_class_path for e in result.errors] == ["django_outbox.jobs.WorkerLost"]
    assert Payment.objects.filter(order_ref=ref).count() == effects


@pytest.mark.jobs
def test_worker_killed_inside_the_batch_finisher(configure_outbox, tmp_path):
    """The last job's worker enqueues the callback and marks the batch finished in one
    transaction: killed before it commits, both are undone, and the sweep does them
    once."""
    configure_outbox(**TIMINGS)
    with batch(on_finish=jobs.batch_done, tag="kp") as opened:
        jobs.add.enqueue(1, 2)
        jobs.add.enqueue(3, 4)

    killed_at("jobs.in_batch_finisher", tmp_path, *WORKER)

    assert finished_jobs() == 2  # recorded before the finisher ran
    assert JobBatch.objects.get(batch_id=opened.id).finished_at is None
    assert not Job.objects.filter(task_path=jobs.batch_done.module_path).exists()
    assert sweep_jobs()["batches_completed"] == 1
    survivor(*WORKER, until=lambda: finished_jobs() == 3, what="the callback to run")
    assert sweep_jobs()["batches_completed"] == 0
    assert list(Payment.objects.values_list("order_ref", "status")) == [("batch:kp", "2/0/2")]
    assert Job.objects.filter(task_path=jobs.batch_done.module_path).count() == 1
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}  # nothing ran twice


@pytest.mark.jobs
def test_sweep_killed_inside_its_rescue(configure_outbox, tmp_path):
    """A rescue rolled back with its sweep is done whole by the next sweep: the lost
    attempt is recorded once, and the job runs again once."""
    configure_outbox(**TIMINGS)
    result = jobs.record_payment.enqueue("rescued")
    killed_at("jobs.in_job", tmp_path, *WORKER)
    wait_for(
        lambda: Job.objects.filter(locked_until__lt=timezone.now()).exists(),
        timeout=10,
        what="the dead worker's lease to run out",
    )

    killed_at("jobs.in_rescue", tmp_path, "jobs_sweep")

    job = Job.objects.get()
    assert (job.state, job.errors) == (JobState.RUNNING, [])  # rolled back
    assert summary(until_idle("jobs_sweep"))["rescued"] == 1
    survivor(*WORKER, until=finished_jobs, what="the rescued job to run")
    result.refresh()
    assert (result.status, result.attempts) == ("SUCCESSFUL", 2)
    assert [e.exception_class_path for e in result.errors] == ["django_outbox.jobs.WorkerLost"]
    assert Payment.objects.filter(order_ref="rescued").count() == 1
