"""Django admin for django-outbox: one module per part, shared pieces in ``shared``, and
the health page of all three in ``health``."""

from django_outbox.admin.health import HealthAdmin
from django_outbox.admin.inbox import InboxMessageAdmin
from django_outbox.admin.jobs import JobAdmin
from django_outbox.admin.outbox import OutboxMessageAdmin

__all__ = ["HealthAdmin", "InboxMessageAdmin", "JobAdmin", "OutboxMessageAdmin"]
