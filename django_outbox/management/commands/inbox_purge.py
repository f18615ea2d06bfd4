from __future__ import annotations

from django_outbox.inbox.maintenance import purge
from django_outbox.management.commands._maintenance import PurgeCommand


class Command(PurgeCommand):
    help = (
        "Delete handled and skipped inbox messages older than the retention period (the "
        "deduplication window: a duplicate arriving later is no longer recognised)."
    )
    noun = "message"
    purge = staticmethod(purge)
