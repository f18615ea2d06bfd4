"""A Celery beat schedule for the outbox sweeps.

Adopt it in one line in your Celery app module::

    app.conf.beat_schedule = {**app.conf.beat_schedule, **OUTBOX_BEAT_SCHEDULE}
"""

from __future__ import annotations

from typing import Any

#: Sweep every 10 seconds (rescue expired leases, deliver what a lost trigger
#: left behind); purge finished rows hourly.
OUTBOX_BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    "django-outbox-sweep": {
        "task": "django_outbox.sweep_outbox",
        "schedule": 10.0,
        "options": {"expires": 10.0},
    },
    "django-outbox-purge": {
        "task": "django_outbox.purge_outbox",
        "schedule": 3600.0,
        "options": {"expires": 3600.0},
    },
}
