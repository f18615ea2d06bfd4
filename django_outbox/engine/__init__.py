"""The engine shared by the outbox, the inbox and jobs.

Rows that the engine drives have the fields ``state``, ``attempts``,
``locked_until`` and ``lock_token``. The engine claims batches under a lease,
records outcomes with fencing (a stale lease holder changes nothing), computes
backoff, and purges finished rows in bounded batches.
"""

from django_outbox.engine.backoff import backoff_delay
from django_outbox.engine.lease import Lease, claim, fenced, update_each, with_ids
from django_outbox.engine.purge import purge_in_batches
from django_outbox.engine.retry import retry_transient

__all__ = [
    "Lease",
    "backoff_delay",
    "claim",
    "fenced",
    "purge_in_batches",
    "retry_transient",
    "update_each",
    "with_ids",
]
