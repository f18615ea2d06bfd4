"""A Celery beat schedule for the outbox sweeps.

Adopt it in one line in your Celery app module::

    app.conf.beat_schedule = {**app.conf.beat_schedule, **OUTBOX_BEAT_SCHEDULE}
"""

from __future__ import annotations

from typing import Any

#: How often each part is swept (rescue expired leases, deliver, handle or run what a
#: lost trigger left behind) and purged, in seconds.
SWEEP_SECONDS = 10.0
PURGE_SECONDS = 3600.0


def _entries(part: str, suffix: str) -> dict[str, dict[str, Any]]:
    """The sweep and purge entries of one part (*suffix* names its tasks); a run that
    could not start before the next one is due expires instead of piling up."""
    return {
        f"django-outbox-{part}sweep": {
            "task": f"django_outbox.sweep_{suffix}",
            "schedule": SWEEP_SECONDS,
            "options": {"expires": SWEEP_SECONDS},
        },
        f"django-outbox-{part}purge": {
            "task": f"django_outbox.purge_{suffix}",
            "schedule": PURGE_SECONDS,
            "options": {"expires": PURGE_SECONDS},
        },
    }


#: One schedule for the outbox, the inbox and the jobs (a sweep of a part with no
#: rows costs one query): sweeps every 10 seconds, purges hourly.
OUTBOX_BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    **_entries("", "outbox"),
    **_entries("inbox-", "inbox"),
    **_entries("jobs-", "jobs"),
}
