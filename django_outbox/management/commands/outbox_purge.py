from __future__ import annotations

from django_outbox.management.commands._maintenance import PurgeCommand
from django_outbox.outbox.maintenance import purge_finished_messages


class Command(PurgeCommand):
    help = "Delete sent and cancelled outbox messages older than the retention period."
    noun = "message"
    purge = staticmethod(purge_finished_messages)
