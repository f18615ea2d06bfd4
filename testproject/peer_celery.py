"""Benchmark only: the Celery app django-celery-outbox requires (its OutboxCelery)."""

import os

from django_celery_outbox import OutboxCelery

app = OutboxCelery("peer", broker=os.environ.get("PEER_BROKER_URL", "redis://127.0.0.1:6379/10"))
