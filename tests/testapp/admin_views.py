"""A rate-limited view for the admin page's browser test: the "login" policy, keyed by IP."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from django_redislua import get_policy
from django_redislua.decorators import ratelimit


def limited(request: HttpRequest) -> HttpResponse:
    decision = get_policy("login").hit(request.META["REMOTE_ADDR"])
    if not decision.allowed:
        return HttpResponse("Too many requests", status=429,
                            headers={"Retry-After": str(max(1, round(decision.retry_after)))})
    return HttpResponse(f"OK, {decision.remaining} left")


@ratelimit(rate="3/h", key="ip")
def inline_limited(request: HttpRequest) -> HttpResponse:
    """An inline policy: the admin must know it (quota, reset) though settings do not name it."""
    return HttpResponse("ok")
