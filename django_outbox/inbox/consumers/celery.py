"""The Celery task another service's outbox calls (its ``celery`` transport) to deliver
into this service's inbox.

The sender configures a destination ``{"TRANSPORT": "celery", "TASK":
"django_outbox.receive", "QUEUE": "<a queue this service's workers read>"}``.
The payload arrives as the task's argument, the message id as the task id and
the ``outbox-*`` values and the trace context (``traceparent`` …) as task headers.
The task stores the message (a redelivery or a duplicate send finds it stored
and does nothing more) and handles it in the same worker.

The source is the ``celery`` source whose ``QUEUE`` is the queue the task came
from, else the only ``celery`` source configured, else one called ``celery``.

The task is acknowledged only after it ran (``acks_late``), and a delivery
whose worker process died under it goes back to the queue
(``reject_on_worker_lost``): a worker killed before the store commits gets
the message again, and one killed after it finds it stored. A database that
cannot be reached gives the delivery back too, after a pause (Celery would
otherwise acknowledge the failed task). A redelivered message that is stored
but not yet handled (its worker died inside the handler) is not handled again
inline, where a message that kills its worker would loop at once: its trigger
is sent as ``DISPATCH`` says, and the sweep is the backstop.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from celery import Task, shared_task
from django.db import router

from django_outbox import tracing
from django_outbox.conf import Source, get_settings
from django_outbox.engine import heartbeat, triggers
from django_outbox.engine.retry import retry_transient
from django_outbox.inbox.intake import Arrival, Unstorable, store, store_unreadable
from django_outbox.inbox.models import InboxMessage, InboxState
from django_outbox.inbox.tasks import give_back_on_database_error
from django_outbox.wire import TRACE_HEADERS

logger = logging.getLogger("django_outbox.inbox")


def source_for(queue: str | None) -> Source:
    """The source of a delivery that came through *queue*."""
    sources = [s for s in get_settings().inbox.sources.values() if s.transport == "celery"]
    for source in sources:
        if queue and source.options.get("queue") == queue:
            return source
    if len(sources) == 1:
        return sources[0]
    return Source(name="celery", transport="celery")


@shared_task(
    name="django_outbox.receive",
    bind=True,
    ignore_result=True,
    acks_late=True,
    reject_on_worker_lost=True,
)
def receive_task(self: Task[Any, Any], /, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Store the delivered message (the task's one argument, its payload) in the inbox,
    then handle what is due. A call with other arguments is kept as unreadable (a
    signature error would fail the task, and the message would be gone unrecorded).

    The database is this service's choice (its router's for the inbox), never the
    sender's: a ``using`` keyword in the call is one of those other arguments."""
    from django_outbox.inbox.handling import Inbox

    using = router.db_for_write(InboxMessage)

    request = self.request
    # Its claims carry this process's id: if it dies mid-handler, they come back in
    # seconds.
    heartbeat.start_for_task(request)
    # Celery hands the task's message headers over as attributes of its request, among
    # its own: the outbox's and the trace propagation headers are read, nothing else.
    headers = {
        name: getattr(request, name)
        for name in dir(request)
        if name.startswith("outbox-") and getattr(request, name, None) is not None
    }
    headers.update(
        (name, getattr(request, name))
        for name in TRACE_HEADERS
        if getattr(request, name, None) is not None
    )
    queue = (request.delivery_info or {}).get("routing_key")
    arguments_problem = ""
    if len(args) != 1 or kwargs:
        arguments_problem = (
            f"task arguments are not (payload,): got {len(args)} positional argument(s)"
            + (f" and the keywords {sorted(kwargs)}" if kwargs else "")
        )
        body = json.dumps({"args": list(args), "kwargs": kwargs}, default=repr).encode()
    else:
        body = json.dumps(args[0]).encode()
    arrival = Arrival(
        source=source_for(queue),
        body=body,
        headers=headers,
        transport_id=request.id,
    )
    if arguments_problem:
        message, _ = retry_transient(
            lambda: store_unreadable(arrival, arguments_problem, using=using),
            what=f"keeping a malformed call from {arrival.source.name}",
            reconnect=using,
        )
        return {"message_id": message.message_id, "created": False, "handled": 0}
    try:
        with (
            tracing.receiving(arrival.source, [arrival]),
            give_back_on_database_error(f"storing message {request.id} from {queue}"),
        ):
            message, created = retry_transient(
                lambda: store(arrival, using=using, trigger=False),
                what=f"storing a message from {arrival.source.name}",
                reconnect=using,
            )
    except Unstorable as exc:
        logger.error("%s; acknowledged", exc)
        return {"message_id": request.id, "created": False, "handled": 0}
    handled = 0
    if created:
        handled = Inbox(using=using).deliver([message.pk]).done
    elif message.state == InboxState.SHOULD_BE_HANDLED:
        # Stored by a delivery whose worker died before handling it: wake the
        # handlers rather than handle it here (see the module's docstring).
        triggers.dispatch("inbox", using, [message.pk])
    return {"message_id": message.message_id, "created": created, "handled": handled}
