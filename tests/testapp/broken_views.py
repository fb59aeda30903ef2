"""Views with configuration mistakes, routed by tests/testapp/broken_urls.py: the system checks
must report each one, and a request to any of them must never raise (FAIL_OPEN decides)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.utils.decorators import method_decorator
from django.views import View
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redislua import drf
from django_redislua.decorators import ratelimit


@ratelimit("typo")
def unknown_policy(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(rate="20/x")
def bad_inline_rate(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(rate="5/m", algorithm="leaky")
async def bad_inline_algorithm(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def _garbage_rate(request: HttpRequest) -> object:
    return ["not", "a", "rate"]


@ratelimit(rate=_garbage_rate)
def garbage_rate_callable(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("login", key="cookie:x")
def bad_key_override(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


class MethodDecorated(View):
    @method_decorator(ratelimit("typo-on-a-method"))
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")


@ratelimit("api")
@ratelimit("typo-stacked")
def one_good_one_broken(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("api")
def uses_another_policy(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


class ScopeWithoutRate(APIView):
    throttle_classes = [drf.ScopedRateThrottle]
    throttle_scope = "no-such-scope"

    def get(self, request: Request) -> Response:
        return Response({"ok": True})


class UnknownThrottlePolicy(APIView):
    throttle_classes = [drf.PolicyThrottle]
    throttle_policy = ["api", "nope"]

    def get(self, request: Request) -> Response:
        return Response({"ok": True})
