"""``/metrics`` for Prometheus, for a project without django-prometheus.

``path("", include("django_redislua.urls"))`` (or any prefix) routes ``metrics``: everything in
``prometheus_client``'s default registry (this app's ``redislua_*`` metrics, and whatever else the
project registers), in Prometheus's text format. It is guarded: a staff user's session, or
``Authorization: Bearer <REDISLUA["METRICS_TOKEN"]>`` (what a Prometheus scrape config sends
with ``authorization: {credentials: ...}``); anything else is a 403, before any metric is read.
"""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from django_redislua.conf import settings


def _allowed(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)
    if user is not None and user.is_active and user.is_staff:
        return True
    token = settings.METRICS_TOKEN
    given = request.headers.get("Authorization", "")
    scheme, _, credentials = given.partition(" ")
    return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(
        credentials.strip().encode(), str(token).encode())


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Every metric of the default ``prometheus_client`` registry, for a staff user or a
    bearer of ``METRICS_TOKEN``."""
    if not _allowed(request):
        return HttpResponse("Forbidden: a staff session or the METRICS_TOKEN bearer token is "
                            "required.\n", status=403, content_type="text/plain; charset=utf-8")
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
    except ImportError:
        return HttpResponse("prometheus_client is not installed: "
                            "pip install 'django-redislua[prometheus]'\n", status=501,
                            content_type="text/plain; charset=utf-8")
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
