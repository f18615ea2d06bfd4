"""A stand-in for another service's Celery task, used by the Celery transport test."""

import json
import os

import redis
from celery import shared_task


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
