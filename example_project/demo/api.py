"""DRF viewsets, one per throttle of ``django_redislua.drf``. Rates: ``REST_FRAMEWORK`` and
``REDISLUA["POLICIES"]`` in settings.py. Every response lists its decisions and carries the
RateLimit headers; a throttled one is a 429 with Retry-After."""

from typing import Any

from rest_framework import routers, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from django_redislua import drf


class DecisionsViewSet(viewsets.ViewSet):
    """Shows what the throttles decided for this request (``request.ratelimit``)."""

    def list(self, request: Request) -> Response:
        decisions: list[Any] = getattr(request, "ratelimit", [])
        return Response([
            {"policy": d.policy.name, "algorithm": d.policy.algorithm, "limit": d.limit,
             "remaining": d.remaining, "reset_after": round(d.reset_after, 3)}
            for d in decisions
        ])


class GlobalViewSet(DecisionsViewSet):
    """No throttle_classes here: REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"] (anon + user)."""


class AnonViewSet(DecisionsViewSet):
    """``anon`` rate, by client address; signed-in users are not throttled here."""

    throttle_classes = [drf.AnonRateThrottle]


class UserViewSet(DecisionsViewSet):
    """``user`` rate, by user id (or address when anonymous)."""

    throttle_classes = [drf.UserRateThrottle]


class BurstViewSet(DecisionsViewSet):
    """``burst`` scope: 5 requests in any 10 seconds, a rate DRF's own classes cannot parse."""

    throttle_classes = [drf.ScopedRateThrottle]
    throttle_scope = "burst"


class SearchViewSet(DecisionsViewSet):
    """The REDISLUA ``search`` policy: a token bucket, 10/s with bursts of 50."""

    throttle_classes = [drf.PolicyThrottle]
    throttle_policy = "search"


class ExportViewSet(DecisionsViewSet):
    """The REDISLUA ``export`` policy: 2 requests in flight per signed-in user."""

    throttle_classes = [drf.PolicyThrottle]
    throttle_policy = "export"


router = routers.DefaultRouter()
router.register("global", GlobalViewSet, basename="api-global")
router.register("anon", AnonViewSet, basename="api-anon")
router.register("user", UserViewSet, basename="api-user")
router.register("burst", BurstViewSet, basename="api-burst")
router.register("search", SearchViewSet, basename="api-search")
router.register("export", ExportViewSet, basename="api-export")
