from django.apps import AppConfig


class DjangoOutboxConfig(AppConfig):
    name = "django_outbox"
    verbose_name = "Outbox, inbox and jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_outbox import checks  # noqa: F401  (registers the system checks)
        from django_outbox.inbox import handlers, handling  # noqa: F401  (the inbox part)
        from django_outbox.jobs import running  # noqa: F401  (registers the jobs part)
        from django_outbox.outbox import relay  # noqa: F401  (registers the outbox part)

        handlers.autodiscover()
