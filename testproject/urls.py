from django.contrib import admin
from django.urls import include, path

from django_outbox.metrics import metrics_view
from testproject.shop.bench_views import bare_insert

urlpatterns = [
    path("admin/", admin.site.urls),
    path("inbox/", include("django_outbox.urls")),
    path("metrics/", metrics_view),
    path("outbox/health/", include("django_outbox.health.urls")),
    # The webhook benchmark's bound (PostgreSQL only): a bare INSERT per delivery.
    path("bench/bare-insert/<str:source>/", bare_insert),
]
