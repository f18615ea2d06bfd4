"""The health probe's URL, to include where you want it (it is not routed by itself)::

    path("outbox/health/", include("django_outbox.health.urls")),

``reverse("django_outbox_health:health")`` then finds it. See ``health.views``.
"""

from django.urls import path

from django_outbox.health.views import health

app_name = "django_outbox_health"

urlpatterns = [
    path("", health, name="health"),
]
