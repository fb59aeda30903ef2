"""64 requests at once against a 10/m scope: ours admits exactly 10; DRF's own, more.

DRF's ``SimpleRateThrottle`` reads the history from the cache, checks it in Python and writes it
back: requests that read before any of them wrote all pass. Ours decides in one Lua script.
Run with ``-s`` to see DRF's figure, which varies from run to run.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.cache import caches
from django.test import override_settings
from rest_framework import throttling
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory, force_authenticate
from rest_framework.views import APIView

from django_redislua import drf
from django_redislua.testing import CommandRecorder

REQUESTS = 64
RATE = "10/m"
ALICE = User(pk=1, username="alice")
BOB = User(pk=2, username="bob")


def view_with(throttle: type[throttling.BaseThrottle]) -> Any:
    class View(APIView):
        throttle_classes = [throttle]

        def get(self, request: Request) -> Response:
            return Response({"ok": True})

    return View.as_view()


def request_as(user: User) -> Any:
    request = APIRequestFactory().get("/", REMOTE_ADDR="10.0.0.1")
    force_authenticate(request, user=user)
    return request


def burst(view: Any) -> list[int]:
    """REQUESTS requests by one user, released together by a barrier; their status codes."""
    requests = [request_as(ALICE) for _ in range(REQUESTS)]
    barrier = threading.Barrier(REQUESTS, timeout=20)

    def one(request: Any) -> int:
        barrier.wait()
        return int(view(request).status_code)

    with ThreadPoolExecutor(max_workers=REQUESTS) as pool:
        futures = [pool.submit(one, request) for request in requests]
        return [future.result(timeout=30) for future in futures]


@override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {"user": RATE}},
                   REDISLUA={**settings.REDISLUA, "LOCAL_DENY": False})
def test_ours_admits_exactly_the_rate(recorder: CommandRecorder) -> None:
    """One round trip per request. The local denial cache is off here: with it, a request that
    starts after this process learned a denial is answered without one (fewer EVALSHAs, as many
    as the transport is slow)."""
    view = view_with(drf.UserRateThrottle)
    assert view(request_as(BOB)).status_code == 200  # loads the script before the burst
    with recorder:
        codes = burst(view)
    admitted = codes.count(200)
    print(f"\ndjango_redislua.drf.UserRateThrottle admitted {admitted} of {REQUESTS} at {RATE}")
    assert admitted == 10
    assert codes.count(429) == REQUESTS - 10
    # One round trip per request (new pooled connections also send their handshake).
    assert recorder.commands_without_handshake == ["EVALSHA"] * REQUESTS


class DRFUserRateThrottle(throttling.UserRateThrottle):
    """DRF's own class, on the same Redis through the django-redis cache alias."""

    cache = caches["django_redis"]
    THROTTLE_RATES = {"user": RATE}  # DRF freezes rates at import; set them on the class


def test_drf_own_throttle_on_the_same_redis() -> None:
    codes = burst(view_with(DRFUserRateThrottle))
    admitted = codes.count(200)
    print(f"\nrest_framework's UserRateThrottle admitted {admitted} of {REQUESTS} at {RATE}")
    assert admitted >= 10
    assert set(codes) <= {200, 429}


@pytest.mark.parametrize("_round", range(3))
@override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {"user": RATE}})
def test_ours_is_exact_every_time(_round: int) -> None:
    assert burst(view_with(drf.UserRateThrottle)).count(200) == 10
