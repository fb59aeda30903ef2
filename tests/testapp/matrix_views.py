"""The views every deployment of tests/test_deployments.py is tried with: a sync view, an async
view and a DRF view throttled only by the global DEFAULT_THROTTLE_CLASSES, each limited 3/h."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redislua.decorators import ratelimit


@ratelimit(rate="3/h", key="ip")
def sync_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(rate="3/h", key="ip")
async def async_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


class GlobalThrottled(APIView):
    """No throttle_classes of its own: REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"] applies."""

    authentication_classes: list[type] = []

    def get(self, request: Request) -> Response:
        return Response({"ok": True})
