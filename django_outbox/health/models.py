"""The health page's entry in the admin: a proxy of the worker table, no table of its own.

The admin's index lists models, so the health page (``admin.health``) needs one to be
listed under this app. It has no permissions of its own: whoever may view one of the
three parts may open it.
"""

from __future__ import annotations

from django_outbox.engine.models import Worker


class Health(Worker):
    """The health of the outbox, the inbox and the jobs (the admin's health page)."""

    class Meta:
        proxy = True
        app_label = "django_outbox"
        verbose_name = "health"
        verbose_name_plural = "health"
        default_permissions = ()
