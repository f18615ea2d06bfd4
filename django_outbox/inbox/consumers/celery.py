"""The Celery task another service's outbox calls (its ``celery`` transport) to deliver
into this service's inbox.

The sender configures a destination ``{"TRANSPORT": "celery", "TASK":
"django_outbox.receive", "QUEUE": "<a queue this service's workers read>"}``.
The payload arrives as the task's argument, the message id as the task id and
the ``outbox-*`` values as task headers. The task stores the message (a
redelivery or a duplicate send finds it stored and does nothing more) and
handles it in the same worker.

The source is the ``celery`` source whose ``QUEUE`` is the queue the task came
from, else the only ``celery`` source configured, else one called ``celery``.
"""

from __future__ import annotations

import json
from typing import Any

from celery import Task, shared_task
from django.db import DEFAULT_DB_ALIAS, transaction

from django_outbox.conf import Source, get_settings
from django_outbox.inbox.intake import Arrival, store


def source_for(queue: str | None) -> Source:
    """The source of a delivery that came through *queue*."""
    sources = [s for s in get_settings().inbox.sources.values() if s.transport == "celery"]
    for source in sources:
        if queue and source.options.get("queue") == queue:
            return source
    if len(sources) == 1:
        return sources[0]
    return Source(name="celery", transport="celery")


@shared_task(name="django_outbox.receive", bind=True, ignore_result=True)
def receive_task(self: Task, payload: Any, using: str = DEFAULT_DB_ALIAS) -> dict[str, Any]:  # type: ignore[type-arg]
    """Store the delivered message in the inbox, then handle what is due."""
    from django_outbox.inbox.handling import Inbox

    request = self.request
    headers = {
        name: getattr(request, name)
        for name in dir(request)
        if name.startswith("outbox-") and getattr(request, name, None) is not None
    }
    queue = (request.delivery_info or {}).get("routing_key")
    arrival = Arrival(
        source=source_for(queue),
        body=json.dumps(payload).encode(),
        headers=headers,
        transport_id=request.id,
    )
    with transaction.atomic(using=using):
        message, created = store(arrival, using=using, trigger=False)
    handled = Inbox(using=using).deliver([message.pk]).done if created else 0
    return {"message_id": message.message_id, "created": created, "handled": handled}
