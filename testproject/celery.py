"""The test project's Celery app: broker from CELERY_BROKER_URL, embedded by default."""

import os

from celery import Celery

from django_outbox.beat import OUTBOX_BEAT_SCHEDULE

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

app = Celery("testproject")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.beat_schedule = {**app.conf.beat_schedule, **OUTBOX_BEAT_SCHEDULE}
if os.environ.get("TESTPROJECT_SWEEP_SECONDS"):  # the demo sweeps faster than production
    for entry in ("django-outbox-sweep", "django-outbox-jobs-sweep"):
        app.conf.beat_schedule[entry]["schedule"] = float(os.environ["TESTPROJECT_SWEEP_SECONDS"])
if os.environ.get("TESTPROJECT_PERIODIC_JOB_SECONDS"):  # a periodic job, for its test
    from django_outbox.jobs.periodic import periodic

    app.conf.beat_schedule["testproject-tick"] = periodic(
        "testproject.shop.jobs.record_payment",
        float(os.environ["TESTPROJECT_PERIODIC_JOB_SECONDS"]),
        args=["tick"],
        options={"queue": os.environ.get("TESTPROJECT_PERIODIC_QUEUE", "celery")},
    )
app.autodiscover_tasks()
