"""Benchmark only: the test project plus django-celery-outbox, a peer library
measured side by side with django-outbox (``make bench``)."""

from testproject.settings import *  # noqa: F403
from testproject.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "django_celery_outbox"]
CELERY_OUTBOX_APP = "testproject.peer_celery.app"
LOGGING_CONFIG = None  # the peer logs through structlog; keep the benchmark quiet
