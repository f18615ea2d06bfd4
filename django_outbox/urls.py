"""URLs to include for the inbox's webhook: ``path("inbox/", include("django_outbox.urls"))``."""

from django.urls import path

from django_outbox.inbox.consumers.webhook import webhook

app_name = "django_outbox"

urlpatterns = [
    path("<str:source>/", webhook, name="webhook"),
]
