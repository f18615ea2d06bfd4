"""The jobs' state machine under any sequence of enqueues, batches, workers that die
holding a batch, lease rescues and operator actions (retry, cancel, skip), against the
real database.

Hypothesis runs the real ``Jobs`` runner over a task whose runs succeed (one
``Payment`` row), raise a retried error or a ``dont_retry`` one as it chooses. A model
in Python predicts each job's status, attempts and resolution; after every step the
table agrees with it: every job exactly once, lease fields set exactly while RUNNING,
attempts within the task's ``max_attempts``, one effect per successful job and none
for any other (no job here dies mid-run, so none may run twice).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from django_outbox.engine import clock, sweeps
from django_outbox.jobs.models import Job, JobState, Resolution
from django_outbox.jobs.running import Jobs, Running
from testproject.shop.models import Payment
from tests.properties import tasks

pytestmark = [pytest.mark.properties, pytest.mark.jobs, pytest.mark.django_db(transaction=True)]

MAX_ATTEMPTS = 2
READY, RUNNING = JobState.READY, JobState.RUNNING
SUCCESSFUL, FAILED = JobState.SUCCESSFUL, JobState.FAILED


@dataclass
class Expected:
    pk: int
    tag: str
    state: str = READY
    attempts: int = 0
    resolution: str = Resolution.NONE
    token: uuid.UUID | None = None
    locked_until: Any = None
    due_at: Any = None


class JobsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        Job.objects.all().delete()
        Payment.objects.all().delete()
        tasks.script.clear()
        self.now = clock.read_now("default").replace(microsecond=0) + timedelta(hours=1)
        self.jobs: dict[int, Expected] = {}

    def runner(self) -> Jobs:
        return Jobs(clock=lambda: self.now)

    def due(self) -> list[Expected]:
        return [j for j in self.jobs.values() if j.state == READY and j.due_at <= self.now]

    @rule()
    def enqueue(self) -> None:
        tag = f"t{len(self.jobs)}"
        result = tasks.scripted.enqueue(tag)
        job = Job.objects.get(result_id=result.id)
        self.jobs[job.pk] = Expected(job.pk, tag, due_at=job.available_at)

    @rule(
        outcomes=st.lists(st.sampled_from(("ok", "retry", "retry", "fail")), max_size=8),
        later=st.sampled_from([0, 10, 10]),
    )
    def run_batch(self, outcomes: list[str], later: int) -> None:
        self.now += timedelta(seconds=later)
        waiting = sorted((j for j in self.jobs.values() if j.state == READY), key=lambda j: j.pk)
        for job, outcome in zip(waiting, outcomes, strict=False):
            tasks.script[job.tag] = outcome
        due = self.due()
        result = self.runner().run_batch()
        assert result.claimed == len(due)
        stored = {job.pk: job for job in Job.objects.filter(pk__in=[j.pk for j in due])}
        for job in due:
            job.attempts += 1
            outcome = tasks.script.get(job.tag, "ok")
            if outcome == "ok":
                job.state = SUCCESSFUL
            elif outcome == "fail" or job.attempts >= MAX_ATTEMPTS:
                job.state = FAILED
            else:
                job.due_at = stored[job.pk].available_at
                assert self.now < job.due_at <= self.now + timedelta(seconds=6)

    @rule()
    def worker_dies_holding_a_batch(self) -> None:
        due = self.due()
        rows, lease = self.runner().claim_batch()
        assert {row.pk for row in rows} == {job.pk for job in due}
        stored = dict(
            Job.objects.filter(pk__in=[r.pk for r in rows]).values_list("pk", "locked_until")
        )
        for job in due:
            job.state, job.token, job.locked_until = RUNNING, lease.token, stored[job.pk]

    @rule(seconds=st.sampled_from([1, 30, 400]))
    def time_passes(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @rule()
    def sweep_expired_leases(self) -> None:
        stuck = [j for j in self.jobs.values() if j.state == RUNNING and j.locked_until < self.now]
        sweeps.rescue_stuck(Running(), at=self.now)
        for job in stuck:
            # Claimed without a heartbeat: counted as started, its outcome unknown.
            job.attempts += 1
            job.token = job.locked_until = None
            if job.attempts >= MAX_ATTEMPTS:
                job.state = FAILED
            else:
                job.state, job.due_at = READY, self.now

    def choose(self, data: st.DataObject) -> list[Expected]:
        chosen = data.draw(st.sets(st.sampled_from(sorted(self.jobs) or [0]), max_size=3))
        return [self.jobs[pk] for pk in chosen if pk in self.jobs]

    @rule(data=st.data())
    def operator_retries(self, data: st.DataObject) -> None:
        chosen = self.choose(data)
        moved = Job.objects.filter(pk__in=[j.pk for j in chosen]).retry(now=self.now)
        expected = [j for j in chosen if j.state == FAILED]
        assert moved == len(expected)
        for job in expected:
            job.state, job.attempts, job.resolution, job.due_at = (
                READY,
                0,
                Resolution.NONE,
                self.now,
            )

    @rule(data=st.data())
    def operator_cancels(self, data: st.DataObject) -> None:
        chosen = self.choose(data)
        moved = Job.objects.filter(pk__in=[j.pk for j in chosen]).cancel(now=self.now)
        expected = [j for j in chosen if j.state == READY]
        assert moved == len(expected)
        for job in expected:
            job.state, job.resolution = FAILED, Resolution.CANCELLED

    @rule(data=st.data())
    def operator_skips(self, data: st.DataObject) -> None:
        chosen = self.choose(data)
        Job.objects.filter(pk__in=[j.pk for j in chosen]).skip(now=self.now)
        for job in chosen:
            if job.state == FAILED and job.resolution != Resolution.CANCELLED:
                job.resolution = Resolution.SKIPPED

    @invariant()
    def table_agrees_with_the_model(self) -> None:
        stored = list(Job.objects.order_by("pk"))
        assert {job.pk for job in stored} == set(self.jobs), "a job was lost or appeared"
        effects: dict[str, int] = {}
        for ref in Payment.objects.values_list("order_ref", flat=True):
            effects[ref] = effects.get(ref, 0) + 1
        for job in stored:
            model = self.jobs[job.pk]
            seen = (job.state, job.attempts, job.resolution)
            assert seen == (model.state, model.attempts, model.resolution), (job.pk, seen, model)
            assert job.attempts <= job.max_attempts == MAX_ATTEMPTS
            assert effects.get(model.tag, 0) == (1 if job.state == SUCCESSFUL else 0), model.tag
            if job.state == RUNNING:
                assert job.lock_token == model.token and job.locked_until is not None
            else:
                assert not job.attempt_open and job.locked_until is None, job.pk
                if job.state != SUCCESSFUL:
                    assert job.lock_token is None, job.pk
            if job.state in (SUCCESSFUL, FAILED):
                assert job.finished_at is not None, job.pk
            else:
                assert job.finished_at is None, job.pk
            if job.state == READY:
                assert (job.available_at <= self.now) == (model.due_at <= self.now), job.pk


def test_the_jobs_state_machine() -> None:
    run_state_machine_as_test(JobsMachine)
