"""Django admin for django-outbox: one module per part, shared pieces in ``shared``."""

from django_outbox.admin.inbox import InboxMessageAdmin
from django_outbox.admin.jobs import JobAdmin
from django_outbox.admin.outbox import OutboxMessageAdmin

__all__ = ["InboxMessageAdmin", "JobAdmin", "OutboxMessageAdmin"]
