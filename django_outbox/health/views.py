"""The health probe: JSON for load balancers, Kubernetes and monitors.

Opt-in: route it yourself (``path("outbox/health/", include("django_outbox.health.urls"))``).
It answers 200 while no check is critical (``"status"`` is ``"ok"`` or ``"warning"``)
and 503 when one is, with every check and the figures in the body
(``health.status.Report.as_dict``). ``?part=outbox`` (repeatable) judges some parts
only.

Nobody anonymous reads it: a caller sends ``Authorization: Bearer <token>`` with the
``HEALTH['TOKEN']`` setting's value (compared in constant time), or is a logged-in
staff user. Anyone else gets 401 (no credentials) or 403 (wrong ones) and a body that
says only that. The figures name destinations, sources, tasks and workers and quote
errors: protect the URL like any internal endpoint all the same.

Each call reads the figures anew (about thirty short queries, no failure groups).
"""

from __future__ import annotations

import hmac
import logging

from django.db import DEFAULT_DB_ALIAS, DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from django_outbox.conf import get_settings
from django_outbox.health import figures, status

logger = logging.getLogger("django_outbox.health")


def _refused(request: HttpRequest) -> HttpResponse | None:
    """Why *request* may not read the probe (a 401 or 403 response), or ``None``."""
    token = get_settings().health.token
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return _answer(403, "this probe takes no such credentials")
        if hmac.compare_digest(given.strip().encode(), token.encode()):
            return None
        return _answer(403, "wrong token")
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        if user.is_active and user.is_staff:
            return None
        return _answer(403, "staff only")
    refused = _answer(401, "credentials required: a bearer token or a staff session")
    refused["WWW-Authenticate"] = 'Bearer realm="django-outbox health"'
    return refused


def _answer(code: int, detail: str) -> JsonResponse:
    return JsonResponse({"detail": detail}, status=code)


@never_cache
@require_safe
def health(request: HttpRequest, using: str = DEFAULT_DB_ALIAS) -> HttpResponse:
    """The health of the outbox, the inbox and the jobs, as JSON: 200 or 503."""
    refused = _refused(request)
    if refused is not None:
        return refused
    parts = request.GET.getlist("part") or None
    unknown = set(parts or ()) - set(figures.PARTS)
    if unknown:
        return _answer(400, f"unknown part(s): {', '.join(sorted(unknown))}")
    try:
        report = status.evaluate(figures.read(using, parts=parts, failures=False))
    except DatabaseError as exc:
        logger.warning("the health probe could not read the database: %s", exc)
        body = {"status": status.CRITICAL, "error": "the database could not be read"}
        return JsonResponse(body, status=503)
    return JsonResponse(report.as_dict(), status=report.http_status)


__all__ = ["health"]
