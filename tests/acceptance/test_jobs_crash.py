"""Jobs under crashes, with real processes and SIGKILL: a committed job runs even if
its enqueuer dies before the trigger; a job whose worker dies runs again within
seconds; a long job keeps its lease; two workers never run one job twice."""

import itertools
import json
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from django.db import transaction

from django_outbox.engine import triggers
from django_outbox.jobs.maintenance import sweep
from django_outbox.jobs.models import Job, JobState
from testproject.shop import jobs
from testproject.shop.models import Payment
from tests.acceptance.helpers import finish, read_as_it_comes, wait_for, wait_for_workers
from tests.acceptance.helpers import stop as stop_process
from tests.conftest import ROOT, spawn_manage, subprocess_env

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.row_locks,
    pytest.mark.processes,
    pytest.mark.jobs,
]

#: An enqueuer that dies with SIGKILL right after its commit, before the on-commit
#: trigger of the job could be sent (its own on-commit callback runs first).
ENQUEUE_AND_DIE = textwrap.dedent(
    """
    import os, signal
    import django
    django.setup()
    from django.db import transaction
    from testproject.shop import jobs
    from testproject.shop.models import Order
    with transaction.atomic():
        transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
        order = Order.objects.create(customer="dies", total_cents=100)
        jobs.record_payment.enqueue(f"order-{order.pk}")
    raise SystemExit("unreachable: the process was killed at its commit")
    """
)


def jobs_worker(*args, **env):
    """A ``jobs_worker`` whose output is read as it comes (a full pipe would stall it)."""
    return read_as_it_comes(
        spawn_manage("jobs_worker", "--json", "--interval", "0.1", *args, env=subprocess_env(**env))
    )


def stop(process, sig=signal.SIGTERM, timeout=20):
    """Signal a worker, wait for it, and return what it printed."""
    return finish(process, sig, timeout)


@pytest.mark.redis
def test_a_job_committed_by_a_process_killed_before_its_trigger_is_run_by_the_sweep(
    configure_outbox, queue_name, monkeypatch
):
    configure_outbox(DISPATCH="celery", DISPATCH_IN_BACKGROUND=False)
    env = subprocess_env(DJANGO_SETTINGS_MODULE="testproject.settings")
    enqueuer = subprocess.run(
        [sys.executable, "-c", ENQUEUE_AND_DIE], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert enqueuer.returncode == -signal.SIGKILL, enqueuer.stderr
    job = Job.objects.get()
    assert job.state == JobState.READY  # committed, never triggered
    assert not Payment.objects.exists()
    # A real Celery worker on a queue of its own (the test broker may hold stale
    # triggers of other tests); the sweep (beat's sweep_jobs) wakes it.
    monkeypatch.setitem(triggers.ROUTES, "jobs", lambda q: ({"queue": q}, {"queue": queue_name}))
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "testproject", "worker", "--pool=solo"),
            *("-Q", queue_name, "--without-heartbeat", "--without-gossip", "--without-mingle"),
            *("-l", "WARNING"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert sweep()["woken_queues"] == ["default"]
        wait_for(
            lambda: Job.objects.filter(state=JobState.SUCCESSFUL).exists(),
            timeout=60,
            what="the Celery worker to run the swept job",
        )
    finally:
        output = stop_process(worker)
    assert Payment.objects.count() == 1, output
    assert Job.objects.get().attempts == 1


def test_a_worker_killed_mid_job_is_rescued_within_seconds_and_the_job_runs_again(tmp_path):
    marker = tmp_path / "started"
    result = jobs.slow.enqueue("killed-mid-job", 60, str(marker))
    doomed = jobs_worker()
    try:
        wait_for(marker.exists, timeout=60, what="the job to start")
        job = Job.objects.get()
        assert job.state == JobState.RUNNING
        assert job.claimed_by is not None
    finally:
        stop(doomed, signal.SIGKILL)
    killed_at = time.monotonic()
    survivor = jobs_worker()
    try:
        wait_for(
            lambda: Job.objects.filter(state=JobState.SUCCESSFUL).exists(),
            timeout=60,
            what="the survivor to run the rescued job",
        )
        took = time.monotonic() - killed_at
    finally:
        stop(survivor)
    result.refresh()
    assert result.status == "SUCCESSFUL"
    assert result.attempts == 2  # the killed attempt counted
    # Each attempt names the worker that ran it: the killed one, then the survivor.
    assert result.worker_ids[0] == str(job.claimed_by)
    assert result.worker_ids[1] != result.worker_ids[0]
    assert [e.exception_class_path for e in result.errors] == ["django_outbox.jobs.WorkerLost"]
    assert Payment.objects.filter(order_ref="killed-mid-job").count() == 1
    assert result.return_value == "killed-mid-job"
    # Heartbeat timeout (3 s) plus a poll, not a 60 s lease.
    assert took < 15, f"rescued after {took:.1f}s"


def test_a_long_job_keeps_its_lease_while_its_worker_lives(configure_outbox, tmp_path):
    # The job outlasts its lease more than twice over, so it lives only if renewed; a
    # renewal comes every beat (1 s) with 3 s to spare: one late beat loses nothing.
    configure_outbox(JOBS={"LEASE_SECONDS": 4.0})
    result = jobs.slow.enqueue("long", 10)
    worker = jobs_worker()
    try:
        deadline = time.monotonic() + 30
        while not result.is_finished and time.monotonic() < deadline:
            sweep()  # would take the job back if its lease had run out
            time.sleep(0.3)
            result.refresh()
    finally:
        output = stop(worker)
    assert result.status == "SUCCESSFUL", output
    assert result.attempts == 1
    assert Payment.objects.filter(order_ref="long").count() == 1


def test_two_workers_share_the_jobs_and_run_each_once():
    count = 400
    workers = [jobs_worker("--batch", "20") for _ in range(2)]
    try:
        # Both up before the jobs exist: one that booted a second sooner could otherwise
        # run all 400 alone.
        wait_for_workers(2)
        with transaction.atomic():
            results = [jobs.record_payment.enqueue(f"shared-{n}") for n in range(count)]
        wait_for(
            lambda: Job.objects.filter(state=JobState.SUCCESSFUL).count() == count,
            timeout=120,
            what="two workers to run every job",
        )
    finally:
        outputs = [stop(w) for w in workers]
    assert Payment.objects.count() == count
    assert Payment.objects.values("order_ref").distinct().count() == count
    summaries = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    assert sum(s["done"] for s in summaries) == count
    assert all(s["done"] > 0 for s in summaries), summaries  # both took a share
    assert {len(r.worker_ids) for r in [jobs.record_payment.get_result(x.id) for x in results]} == {
        1
    }


def test_a_batch_across_two_killed_workers_calls_back_exactly_once():
    from django_outbox.jobs import batch
    from django_outbox.jobs.models import JobBatch

    total, failing = 1000, 50
    with batch(on_finish=jobs.batch_done, tag="big") as opened:
        for n in range(total - failing):
            jobs.slow.enqueue(f"big-{n}", 0.004)
        for n in range(failing):
            jobs.refuses.enqueue(n)
    workers = [jobs_worker("--batch", "25") for _ in range(2)]
    kills = 0
    outputs: list[str] = []
    try:
        for threshold in (200, 500, 750):
            wait_for(
                lambda t=threshold: (
                    Job.objects.filter(state__in=("SUCCESSFUL", "FAILED")).count() >= t
                ),
                timeout=120,
                what=f"{threshold} jobs to finish",
            )
            victim = workers.pop(0)
            outputs.append(stop(victim, signal.SIGKILL))  # mid-batch: its jobs are rescued
            kills += 1
            workers.append(jobs_worker("--batch", "25"))
        try:
            wait_for(
                lambda: Payment.objects.filter(order_ref="batch:big").exists(),
                timeout=120,
                what="the batch's callback to run",
            )
        except AssertionError as exc:
            outputs.extend(stop(w) for w in workers)
            states = sorted(Job.objects.values_list("task_path", "state", "attempts"))
            summary = {(p.rsplit(".", 1)[-1], st): 0 for p, st, _ in states}
            for p, st, _ in states:
                summary[(p.rsplit(".", 1)[-1], st)] += 1
            said = "\n".join(
                line for out in outputs for line in out.splitlines() if "Task id=" not in line
            )
            raise AssertionError(
                f"{exc}; jobs: {summary}; batch: {list(JobBatch.objects.values())}; "
                f"the workers said:\n{said[-5000:]}"
            ) from None
        time.sleep(1.5)  # any second callback would be enqueued and run by now
    finally:
        for worker in workers:
            if worker.poll() is None:
                stop(worker)
    assert kills == 3
    # The kills landed mid-batch: jobs held by a killed worker were rescued and rerun.
    assert Job.objects.filter(attempts__gte=2, batch__batch_id=opened.id).exists()
    row = JobBatch.objects.get(batch_id=opened.id)
    assert (row.total, row.succeeded, row.failed) == (total, total - failing, failing)
    callbacks = Payment.objects.filter(order_ref="batch:big")
    assert list(callbacks.values_list("status", flat=True)) == [
        f"{total - failing}/{failing}/{total}"
    ]
    assert Job.objects.filter(task_path="testproject.shop.jobs.batch_done").count() == 1
    # Every job of the batch ran (at least once: a killed worker's jobs run again).
    ran = set(Payment.objects.filter(status="slow").values_list("order_ref", flat=True))
    assert len(ran) == total - failing


@pytest.mark.redis
def test_celery_beat_ticks_enqueue_periodic_jobs_that_a_worker_runs(
    configure_outbox, queue_name, tmp_path
):
    configure_outbox(DISPATCH="celery")
    env = subprocess_env(
        TESTPROJECT_PERIODIC_JOB_SECONDS="1",
        TESTPROJECT_PERIODIC_QUEUE=queue_name,
        OUTBOX_SETTINGS_JSON=json.dumps(
            {"DISPATCH": "celery", "JOBS": {"CELERY_QUEUES": {"default": queue_name}}}
        ),
    )
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "testproject", "worker", "-B"),
            *("--pool=solo", "-Q", queue_name, "-s", str(tmp_path / "beat-schedule")),
            *("--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "WARNING"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(
            lambda: Payment.objects.filter(order_ref="tick").count() >= 3,
            timeout=60,
            what="three ticks' jobs to run",
        )
    finally:
        output = stop_process(worker)
    ticks = Job.objects.filter(task_path="testproject.shop.jobs.record_payment")
    assert ticks.filter(state=JobState.SUCCESSFUL).count() >= 3, output
    from django_outbox.models import InboxMessage

    # One job per tick: each tick's task id is recorded once, with its job.
    recorded = InboxMessage.objects.filter(type="django_outbox.enqueue_job").count()
    assert recorded == ticks.count()


def test_serial_unique_priority_and_run_after_with_two_workers():
    from django.utils import timezone

    accounts, entries = 4, 8
    first = jobs.sync_customer.enqueue(customer="u")
    # While the first is READY or RUNNING, the same unique key gives the same job.
    assert jobs.sync_customer.enqueue(customer="u").id == first.id
    first_pk = Job.objects.get(result_id=first.id).pk  # may run before the rest exist
    # One job per claim: the two workers interleave on every key, and each claim
    # takes the highest priority that is due. Both are up before the rest exist.
    workers = [jobs_worker("--batch", "1") for _ in range(2)]
    try:
        wait_for_workers(2)
        with transaction.atomic():
            for n in range(entries):
                for a in range(accounts):
                    jobs.ledger_entry.enqueue(account=f"a{a}", n=n)
            later = jobs.add.using(
                run_after=timezone.now() + timezone.timedelta(seconds=2)
            ).enqueue(1, 1)
            lows = [jobs.add.using(priority=-10).enqueue(n, n) for n in range(10)]
            urgent = jobs.add.using(priority=50).enqueue(0, 0)
        wait_for(
            lambda: (
                Job.objects.filter(state=JobState.SUCCESSFUL).count()
                == accounts * entries + 2 + len(lows) + 1
            ),
            timeout=120,
            what="every job to run",
        )
    finally:
        outputs = [stop(w) for w in workers]
    runs = {}
    for ref, status in Payment.objects.values_list("order_ref", "status"):
        account, n = ref.split(":")
        start, end, pid = status.split("-")
        runs.setdefault(account, []).append((float(start), float(end), int(n), pid))
    for account, entries_run in runs.items():
        entries_run.sort()
        assert [n for _, _, n, _ in entries_run] == list(range(entries)), account  # in order
        for (_, end, _, _), (start, _, _, _) in itertools.pairwise(entries_run):
            assert start >= end, f"{account}: two entries overlapped"  # one at a time
    summaries = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    assert all(s["done"] > 0 for s in summaries), summaries  # both workers took part
    later.refresh()
    assert later.started_at >= later.enqueued_at + timezone.timedelta(seconds=2)
    assert Job.objects.filter(unique_key="sync-u").count() == 1
    # The highest priority is claimed first: among the first two jobs to start (the
    # two workers' first claims) once the rest existed, and before every low-priority one.
    starts = sorted(Job.objects.exclude(pk=first_pk).values_list("started_at", "result_id"))
    urgent.refresh()
    assert uuid.UUID(urgent.id) in [rid for _, rid in starts[:2]]
    for low in lows:
        low.refresh()
        assert low.started_at >= urgent.started_at


@pytest.mark.redis
def test_jobs_run_on_a_celery_prefork_worker_with_their_timeouts(configure_outbox, queue_name):
    """DISPATCH celery: the commit's trigger reaches a prefork worker, whose children
    run the jobs (and enforce a job's timeout in their main thread)."""
    # The default job queue's triggers go to a Celery queue of this test's own.
    configure_outbox(
        DISPATCH="celery",
        DISPATCH_IN_BACKGROUND=False,
        JOBS={"CELERY_QUEUES": {"default": queue_name}},
    )
    settings_json = json.dumps(
        {"DISPATCH": "celery", "JOBS": {"CELERY_QUEUES": {"default": queue_name}}}
    )
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "testproject", "worker"),
            *("--pool=prefork", "--concurrency", "2", "-Q", queue_name),
            *("--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "WARNING"),
        ],
        cwd=ROOT,
        env=subprocess_env(OUTBOX_SETTINGS_JSON=settings_json),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        from django.db import transaction

        with transaction.atomic():
            ok = jobs.add.enqueue(20, 22)
            slow = jobs.too_slow.enqueue(30)

        def finished():
            sweep()  # as beat does: the retry after the first timeout comes due later
            return Job.objects.filter(state__in=("SUCCESSFUL", "FAILED")).count() == 2

        try:
            wait_for(finished, timeout=60, what="the Celery worker to run both jobs", interval=0.5)
        except AssertionError as exc:
            states = list(Job.objects.values_list("task_path", "state", "attempts"))
            raise AssertionError(f"{exc}: {states}\n{stop_process(worker)[-3000:]}") from None
    finally:
        output = stop_process(worker) if worker.returncode is None else ""
    ok.refresh()
    slow.refresh()
    assert ok.return_value == 42, output
    assert slow.status == "FAILED"
    assert [e.exception_class_path for e in slow.errors] == [
        "django_outbox.jobs.timeouts.JobTimeout"
    ] * 2
    assert len(ok.worker_ids) == 1 and ok.worker_ids[0] != "(lost)"
