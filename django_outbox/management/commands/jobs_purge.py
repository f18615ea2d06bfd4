from __future__ import annotations

from django_outbox.jobs.maintenance import purge
from django_outbox.management.commands._maintenance import PurgeCommand


class Command(PurgeCommand):
    help = (
        "Delete finished jobs (SUCCESSFUL, FAILED) and batches older than the retention "
        "period, and the counters of serial keys no job uses any more."
    )
    noun = "job"
    purge = staticmethod(purge)
