from django.contrib import admin
from django.urls import include, path

from django_outbox.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("inbox/", include("django_outbox.urls")),
    path("metrics/", metrics_view),
    path("outbox/health/", include("django_outbox.health.urls")),
]
