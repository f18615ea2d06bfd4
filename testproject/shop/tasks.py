"""Celery tasks of the test project: a stand-in for another service's task (the Celery
transport test) and an idempotent task (the inbox's task records)."""

import json
import os

import redis
from celery import shared_task

from django_outbox.inbox.tasks import idempotent_task
from testproject.shop.models import Payment


@shared_task(name="billing.charge_order", bind=True)
def charge_order(self, payload):
    """Record what arrived (payload, task id, outbox headers) in Redis for the test to read."""
    client = redis.Redis.from_url(os.environ["TESTPROJECT_REMOTE_LOG_URL"])
    request = self.request
    headers = {
        name: getattr(request, name.replace("-", "_"), None) or (request.headers or {}).get(name)
        for name in ("outbox-message-id", "outbox-type", "outbox-key", "outbox-sequence")
    }
    entry = {"payload": payload, "task_id": request.id, "headers": headers}
    client.rpush("remote-calls", json.dumps(entry))
    client.close()


@idempotent_task(name="shop.capture_payment", acks_late=True)
def capture_payment(order_ref, fail=False):
    """Records one Payment per run that counts: a redelivered task id adds nothing."""
    Payment.objects.create(order_ref=order_ref, status="task")
    if fail:
        raise ValueError("card declined")
    return order_ref


_bench_counter: list = []


@shared_task(name="shop.bench_noop", acks_late=True, ignore_result=True)
def bench_noop():
    """The benchmark's hand-rolled consumer: a no-op task, counted in Redis (one INCR on
    a connection kept per worker process)."""
    if not _bench_counter:
        _bench_counter.append(redis.Redis.from_url(os.environ["TESTPROJECT_BENCH_REDIS"]))
    _bench_counter[0].incr("bench-noop")
