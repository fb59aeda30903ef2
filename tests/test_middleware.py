"""RateLimitMiddleware: MIDDLEWARE_POLICIES by path prefix and URL name; RateLimited -> 429."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast

import pytest
from django.test import AsyncClient, Client, override_settings

from django_redislua.functions import load_scripts
from django_redislua.limiting import get_policy
from django_redislua.middleware import RateLimitMiddleware
from django_redislua.signals import rate_limited
from tests.settings import MIDDLEWARE, REDISLUA

pytestmark = [pytest.mark.django_db, pytest.mark.topologies]
P = ParamSpec("P")
R = TypeVar("R")

POLICIES = {
    **REDISLUA["POLICIES"],  # type: ignore[dict-item]
    "mw-path": {"rate": "3/m", "key": "ip"},
    "mw-name": {"rate": "2/m", "key": "ip", "methods": ["POST"]},
    "mw-wide": {"rate": "10/m", "key": "ip"},
}
RULES = [
    {"path": "/rl/api/", "policy": "mw-path"},
    {"path": "/rl/api/", "policy": "mw-wide"},
    {"name": "rl-named", "policy": "mw-name"},
]


def with_middleware(test: Callable[P, R]) -> Callable[P, R]:
    """The test, with the middleware and its rules installed when it runs: the settings are
    read then, so a cluster run's CONNECTION (tests/conftest.py) is the one kept."""
    def installed() -> override_settings:
        return override_settings(
            MIDDLEWARE=[*MIDDLEWARE, "django_redislua.middleware.RateLimitMiddleware"],
            REDISLUA={**REDISLUA, "POLICIES": POLICIES, "MIDDLEWARE_POLICIES": RULES},
        )

    if inspect.iscoroutinefunction(test):
        @functools.wraps(test)
        async def arun(*args: P.args, **kwargs: P.kwargs) -> Any:
            with installed():
                return await test(*args, **kwargs)  # type: ignore[misc]
        return cast(Callable[P, R], arun)

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with installed():
            return test(*args, **kwargs)
    return run


def codes(client: Client, url: str, n: int, method: str = "get") -> list[int]:
    return [getattr(client, method)(url).status_code for _ in range(n)]


@with_middleware
def test_path_prefix(client: Client) -> None:
    assert codes(client, "/rl/api/ok/", 4) == [200, 200, 200, 429]
    assert codes(client, "/rl/ok/", 5) == [200] * 5  # outside the prefix


@with_middleware
def test_path_rules_are_one_evalsha_with_headers(client: Client, recorder) -> None:  # type: ignore[no-untyped-def]
    load_scripts()
    with recorder:
        response = client.get("/rl/api/ok/")
    assert recorder.commands == ["EVALSHA"]
    assert '"mw-path";q=3;w=60' in response["RateLimit-Policy"]
    assert '"mw-wide";q=10;w=60' in response["RateLimit-Policy"]


@with_middleware
def test_url_name_with_methods(client: Client) -> None:
    assert codes(client, "/rl/named/", 4) == [200] * 4  # GET: the policy is POST-only
    assert codes(client, "/rl/named/", 3, method="post") == [200, 200, 429]


@with_middleware
def test_unknown_url_is_not_resolved_into_an_error(client: Client) -> None:
    assert client.get("/rl/no-such-page/").status_code == 404


def test_raised_rate_limited_retry_after(client: Client) -> None:
    # The view raises RateLimited with a denied decision once "login" is exhausted.
    policy = get_policy("login")
    for _ in range(5):
        policy.hit("raiser")
    with_mw = [*MIDDLEWARE, "django_redislua.middleware.RateLimitMiddleware"]
    with override_settings(MIDDLEWARE=with_mw):
        response = client.get("/rl/raises/")
    assert response.status_code == 429
    assert response.content == b"Too Many Requests\n"
    assert int(response["Retry-After"]) >= 1


@with_middleware
def test_signal_sender_is_the_middleware(client: Client) -> None:
    senders = []

    def receiver(sender, request, decision, **kwargs):  # type: ignore[no-untyped-def]
        senders.append((sender, decision.policy.name))

    rate_limited.connect(receiver)
    try:
        codes(client, "/rl/api/ok/", 4)
    finally:
        rate_limited.disconnect(receiver)
    assert senders == [(RateLimitMiddleware, "mw-path")]


@with_middleware
async def test_async_stack() -> None:
    client = AsyncClient()
    statuses = [(await client.get("/rl/api/ok/")).status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]


SOFT_RULES = [
    {"path": "/rl/api/", "policy": "mw-wide"},                      # 10/m, blocks
    {"path": "/rl/api/", "policy": "mw-path", "block": False},      # 3/m, only marks
]


def test_a_soft_middleware_rule_never_switches_off_the_blocking_one(client: Client) -> None:
    """The bug: once the soft rule was over its limit nothing was consumed anywhere, so the
    blocking 10/m rule admitted everything."""
    config = {**REDISLUA, "POLICIES": POLICIES, "MIDDLEWARE_POLICIES": SOFT_RULES}
    with override_settings(
        MIDDLEWARE=[*MIDDLEWARE, "django_redislua.middleware.RateLimitMiddleware"],
        REDISLUA=config,
    ):
        responses = [client.get("/rl/api/ok/") for _ in range(50)]
    assert [r.status_code for r in responses] == [200] * 10 + [429] * 40
    assert [r.wsgi_request.limited for r in responses[:10]] == [False] * 3 + [True] * 7
    assert not any(r.has_header("Retry-After") for r in responses[:10])
