"""Signals django-outbox sends. Receivers must be quick and must not raise."""

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("django_outbox.signals")

#: After a transport returned, before outcomes are recorded. Arguments:
#: ``destination`` (str), ``messages`` (list of OutboxMessage), ``outcomes``
#: (message id → error or None). A hook for tracing and fault injection.
outbox_batch_published = Signal()

#: Messages recorded as ``sent``. Arguments: ``messages`` (list of OutboxMessage).
outbox_messages_sent = Signal()

#: A failed attempt. Arguments: ``message``, ``error`` (str), ``will_retry``
#: (bool: False means the message is now in ``send_error``).
outbox_message_failed = Signal()

#: Leases that expired were recovered. Arguments: ``resent`` and ``held`` (ints).
outbox_messages_rescued = Signal()


def emit(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send *signal* to every receiver; a receiver that raises is logged, not propagated.

    A metrics or tracing hook must never turn a published batch into an
    unrecorded one (which the sweep would then publish again).
    """
    for receiver, result in signal.send_robust(sender=sender, **kwargs):
        if isinstance(result, Exception):
            logger.error("receiver %r of a django-outbox signal raised", receiver, exc_info=result)


#: Inbox messages recorded as ``handled`` (after the commit). Arguments:
#: ``messages`` (list of InboxMessage).
inbox_messages_handled = Signal()

#: A failed handling attempt, logged once. Arguments: ``message``, ``error`` (str,
#: the row keeps the traceback), ``will_retry`` (False: now in ``handle_error``).
inbox_message_failed = Signal()

#: A message of a ``strict`` key has waited longer than ``GAP_ALERT_SECONDS`` for an
#: earlier sequence. Arguments: ``message``, ``missing`` (the sequence it waits for).
inbox_gap_detected = Signal()

#: ``inbox_consume`` stored a batch (committed) and is about to acknowledge it.
#: Arguments: ``source`` (str), ``ids`` (the new rows' primary keys). A hook for
#: metrics and for crash tests.
inbox_batch_stored = Signal()

#: Jobs recorded SUCCESSFUL (sent after the commit). Arguments: ``jobs`` (the rows).
#: Django's own ``task_started``/``task_finished`` signals are sent as well.
jobs_finished = Signal()

#: A failed job attempt, logged once. Arguments: ``job``, ``error`` (str; the row
#: keeps each attempt's traceback), ``will_retry`` (False: the job is now FAILED).
job_failed = Signal()
