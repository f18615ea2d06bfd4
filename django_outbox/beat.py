"""A Celery beat schedule for the outbox sweeps.

Adopt it in one line in your Celery app module::

    app.conf.beat_schedule = {**app.conf.beat_schedule, **OUTBOX_BEAT_SCHEDULE}
"""

from __future__ import annotations

from typing import Any

#: Sweep every 10 seconds (rescue expired leases, deliver and handle what a
#: lost trigger left behind); purge finished rows hourly. One schedule for the
#: outbox, the inbox and the jobs (a sweep of a part with no rows costs one query).
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
    # The inbox: handle what a lost trigger left, purge past the dedup window.
    "django-outbox-inbox-sweep": {
        "task": "django_outbox.sweep_inbox",
        "schedule": 10.0,
        "options": {"expires": 10.0},
    },
    "django-outbox-inbox-purge": {
        "task": "django_outbox.purge_inbox",
        "schedule": 3600.0,
        "options": {"expires": 3600.0},
    },
    # Jobs: rescue expired leases, wake queues whose jobs came due, purge.
    "django-outbox-jobs-sweep": {
        "task": "django_outbox.sweep_jobs",
        "schedule": 10.0,
        "options": {"expires": 10.0},
    },
    "django-outbox-jobs-purge": {
        "task": "django_outbox.purge_jobs",
        "schedule": 3600.0,
        "options": {"expires": 3600.0},
    },
}
