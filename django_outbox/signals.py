"""Signals django-outbox sends. Receivers must be quick and must not raise."""

from django.dispatch import Signal

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
