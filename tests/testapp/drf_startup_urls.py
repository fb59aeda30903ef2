"""URLconf of tests/test_drf_startup.py's subprocesses: one API view, throttled by DRF's global
``DEFAULT_THROTTLE_CLASSES`` only (it names no throttle_classes of its own)."""

from django.urls import path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView


class GloballyThrottled(APIView):
    authentication_classes = []  # anonymous: the anon rate applies
    permission_classes = []

    def get(self, request: Request) -> Response:
        return Response({"ok": True})


urlpatterns = [path("throttled/", GloballyThrottled.as_view())]
