"""Count only failures (``count_failures``, issue 35): a login limited by username that its owner's
successful logins do not spend, and that still refuses once the failures have spent it; on the
decorator (sync and asyncio), the middleware and DRF's PolicyThrottle (tests/testapp/
failures_views.py). Every test here fails on the code before: the option did not exist.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.http import HttpResponse
from django.test import AsyncClient, Client, RequestFactory, override_settings

from django_redislua import Policy, get_policy
from django_redislua.checks import check_settings
from django_redislua.decorators import ratelimit
from django_redislua.limiting import PolicyError, clock, denials
from django_redislua.testing import CommandRecorder, RedisServer
from tests.settings import MIDDLEWARE, REDISLUA
from tests.testapp import failures_views
from tests.testapp.failures_views import BUDGET, MIDDLEWARE_POLICIES, POLICIES

pytestmark = pytest.mark.urls("tests.testapp.failures_views")
LAYERS = ("deco", "adeco", "mw", "drf")
WINDOW = 15 * 60


def settings_for(connection: str | None = None, **extra: Any) -> override_settings:
    return override_settings(
        MIDDLEWARE=[*MIDDLEWARE, "django_redislua.middleware.RateLimitMiddleware"],
        REDISLUA={**REDISLUA, "POLICIES": {**REDISLUA["POLICIES"], **POLICIES},  # type: ignore[dict-item]
                  "MIDDLEWARE_POLICIES": MIDDLEWARE_POLICIES,
                  **({"CONNECTION": connection} if connection else {}), **extra},
    )


@pytest.fixture(autouse=True)
def _installed() -> Iterator[None]:
    failures_views.calls.clear()
    failures_views.during_view.clear()
    try:
        with settings_for():
            yield
    finally:
        clock.reset()
        failures_views.during_view.clear()


def login(client: Client, layer: str, password: str, username: str = "alice") -> int:
    return client.post(f"/{layer}/login/", {"username": username, "password": password}
                       ).status_code


def calls(layer: str) -> int:
    return failures_views.calls[f"/{layer}/login/"]


# -- the login of the issue ------------------------------------------------------------------------
@pytest.mark.parametrize("layer", LAYERS)
def test_successes_spend_nothing_and_failures_still_lock_the_account(client: Client,
                                                                     layer: str) -> None:
    assert [login(client, layer, "right") for _ in range(10)] == [200] * 10
    assert [login(client, layer, f"guess{i}") for i in range(BUDGET)] == [401] * BUDGET
    # The budget is spent: even the right password is refused, and never reaches the view.
    assert login(client, layer, "right") == 429
    assert calls(layer) == 10 + BUDGET
    # Another username is another budget, from the same address.
    assert login(client, layer, "nope", username="bob") == 401
    # The per-address policy stacked on it counted every attempt the view saw (the 429 took
    # nothing from it: a request one blocking rule refuses consumes from none).
    assert get_policy("per-ip").peek("127.0.0.1").remaining == 40 - (10 + BUDGET + 1)
    clock.advance(WINDOW - 1)
    assert login(client, layer, "right") == 429
    clock.advance(1)  # the oldest failure has aged out
    assert login(client, layer, "right") == 200
    assert login(client, layer, "right") == 200


@pytest.mark.parametrize("layer", LAYERS)
def test_a_success_after_failures_does_not_reset_them(client: Client, layer: str) -> None:
    """Only the success's own hit is given back: the failures before it stay counted."""
    assert [login(client, layer, "wrong") for _ in range(BUDGET - 1)] == [401] * (BUDGET - 1)
    assert login(client, layer, "right") == 200
    assert login(client, layer, "wrong") == 401
    assert login(client, layer, "right") == 429


@pytest.mark.parametrize("url", ["/deco/login/", "/drf/login/", "/deco/inline/"])
def test_a_success_costs_one_more_round_trip_a_failure_or_a_denial_none(
    client: Client, url: str, r: Any
) -> None:
    """(Two stacked policies on the first two, one on the inline one.)"""
    def sent(password: str, status: int) -> list[str]:
        with CommandRecorder(r) as recorder:
            data = {"username": "alice", "password": password}
            assert client.post(url, data).status_code == status
        return recorder.commands

    client.post(url, {"username": "alice", "password": "right"})  # loads the scripts
    assert sent("right", 200) == ["EVALSHA", "EVALSHA"]
    assert sent("wrong", 401) == ["EVALSHA"]
    assert sent("wrong", 401) == ["EVALSHA"]
    assert sent("wrong", 401) == ["EVALSHA"]
    assert sent("right", 429) == ["EVALSHA"]  # Redis's denial: nothing to give back
    # Known denied here (the denial cache): at most the other policy is asked, nothing given back.
    assert sent("right", 429) in (["EVALSHA"], [])


def test_django_login_view_counts_its_form_shown_again(client: Client, db: None) -> None:
    """Django's LoginView answers wrong credentials with its form again (200) and a success
    with a redirect (302): count_failures=[200] with methods=["POST"]."""
    User.objects.create_user("alice", password="right")
    url = "/deco/django-login/"
    assert client.get(url).status_code == 200  # showing the form counts nothing
    for _ in range(5):
        assert client.post(url, {"username": "alice", "password": "right"}).status_code == 302
        client.logout()
    for _ in range(BUDGET):
        assert client.post(url, {"username": "alice", "password": "wrong"}).status_code == 200
    assert client.post(url, {"username": "alice", "password": "right"}).status_code == 429


def test_a_callable_decides_and_an_inline_policy_takes_it(client: Client) -> None:
    url = "/deco/inline/"
    for _ in range(5):
        assert client.post(url, {"username": "alice", "password": "right"}).status_code == 200
    for _ in range(3):
        assert client.post(url, {"username": "alice", "password": "x"}).status_code == 401
    assert client.post(url, {"username": "alice", "password": "right"}).status_code == 429


def test_shadow_and_marking_policies_give_back_alike(client: Client) -> None:
    url = "/deco/soft/"
    for _ in range(5):
        response = client.post(url, {"username": "alice", "password": "right"})
        assert response.status_code == 200
    assert get_policy("shadow").peek("alice").remaining == BUDGET
    assert get_policy("marking").peek("alice").remaining == BUDGET
    for _ in range(BUDGET):
        client.post(url, {"username": "alice", "password": "x"})
    assert get_policy("shadow").peek("alice").remaining == 0
    assert get_policy("marking").peek("alice").remaining == 0
    assert client.post(url, {"username": "alice", "password": "right"}).status_code == 200


async def test_an_async_view_gives_back_on_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ASGI the refund runs on the running loop's asyncio transport, like the decision:
    the sync transport is never built."""
    from django_redislua import transport

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the sync transport was used by an async view")

    monkeypatch.setattr(transport, "get_transport", forbidden)
    client = AsyncClient()

    async def login(password: str) -> int:
        data = {"username": "alice", "password": password}
        return (await client.post("/adeco/login/", data)).status_code

    assert [await login("right") for _ in range(10)] == [200] * 10
    assert [await login("wrong") for _ in range(BUDGET)] == [401] * BUDGET
    assert await login("right") == 429


# -- atomic ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("layer", ["deco", "drf"])
def test_concurrent_failures_never_exceed_the_budget(layer: str) -> None:
    """20 attempts at once for one username: exactly the budget reaches the view."""
    start = threading.Barrier(20)
    statuses: list[int] = []
    lock = threading.Lock()

    def attempt(i: int) -> None:
        client = Client()
        start.wait(timeout=30)
        status = login(client, layer, f"guess{i}")
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(statuses) == [401] * BUDGET + [429] * (20 - BUDGET)
    assert calls(layer) == BUDGET


# -- what counts as a failure ----------------------------------------------------------------------
@pytest.mark.parametrize("layer", LAYERS)
def test_a_view_that_raises_or_answers_500_is_counted(layer: str) -> None:
    client = Client(raise_request_exception=False)
    assert login(client, layer, "boom") == 500
    assert login(client, layer, "crash") == 500
    assert login(client, layer, "boom") == 500
    assert login(client, layer, "right") == 429
    assert calls(layer) == BUDGET


def test_a_count_failures_callable_that_raises_counts_the_request(
    caplog: pytest.LogCaptureFixture
) -> None:
    def broken(request: Any, response: Any) -> bool:
        raise ValueError("oops")

    @ratelimit(rate="2/m", key="ip", algorithm="sliding_log", count_failures=broken)
    def view(request: Any) -> HttpResponse:
        return HttpResponse("ok")

    with caplog.at_level(logging.ERROR, logger="django_redislua"):
        assert [view(RequestFactory().get("/")).status_code for _ in range(3)] == [200, 200, 429]
    logged = [r for r in caplog.records if "count_failures callable raised" in r.getMessage()]
    assert len(logged) == 1  # once a minute, not once a request


# -- Redis failing between the decision and the refund ---------------------------------------------
@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


@pytest.mark.parametrize("layer", LAYERS)
def test_redis_stopped_before_the_refund_still_answers(
    layer: str, server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = Client(raise_request_exception=True)
    with settings_for(server.url, SOCKET_TIMEOUT=0.3, SOCKET_CONNECT_TIMEOUT=0.3):
        assert login(client, layer, "right") == 200  # connected, scripts loaded
        failures_views.during_view.append(server.stop)
        with caplog.at_level(logging.WARNING, logger="django_redislua"):
            assert login(client, layer, "right") == 200  # the view's answer, not a 500
    logged = [r.getMessage() for r in caplog.records if r.name == "django_redislua"]
    assert len(logged) == 1 and "giving back" in logged[0], logged


def test_redis_paused_during_the_refund_still_answers_in_time(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Connected but silent (CLIENT PAUSE): the refund waits for the socket timeout, no
    longer; the response goes out, the success stays counted (a failure more: the safe
    side). "No longer" is shown by the failed give-back it logs while the server is still
    silent (script calls held for 30 s, lifted once the response is out), not by a bound on
    the time taken, which a loaded machine stretches."""
    client = Client(raise_request_exception=True)
    control = server.client()

    def pause() -> None:
        # WRITE holds every script call; unlike ALL, it lets CLIENT UNPAUSE lift it at once.
        control.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")

    with settings_for(server.url, SOCKET_TIMEOUT=0.3, SOCKET_CONNECT_TIMEOUT=0.3):
        assert login(client, "deco", "right") == 200
        failures_views.during_view.append(pause)
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="django_redislua"):
            status = login(client, "deco", "right")
        elapsed = time.monotonic() - started
        control.execute_command("CLIENT", "UNPAUSE")
        control.close()
    assert status == 200
    assert elapsed >= 0.3 * 0.9  # it did wait for the socket timeout
    assert any("giving back" in r.getMessage() for r in caplog.records)
    denials.forget()


# -- the option ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("spec", "expected"), [
    (True, frozenset(range(400, 500))),
    ([401, 403], frozenset({401, 403})),
    ((200,), frozenset({200})),
    (False, None),
    (None, None),
])
def test_the_option_takes_statuses(spec: Any, expected: Any) -> None:
    policy = Policy("login", rate="3/15m", algorithm="sliding_log", count_failures=spec)
    assert policy.count_failures == expected


def judge(request: Any, response: Any) -> bool:
    return bool(response.status_code == 401)


def test_the_option_takes_a_callable_or_its_dotted_path() -> None:
    assert Policy("a", rate="3/m", count_failures=judge).count_failures is judge
    dotted = Policy("b", rate="3/m", count_failures="tests.test_count_failures.judge")
    assert dotted.count_failures is judge


@pytest.mark.parametrize(("options", "says"), [
    ({"count_failures": 401}, "must be True"),
    ({"count_failures": []}, "status codes"),
    ({"count_failures": [401, "403"]}, "status codes"),
    ({"count_failures": [99]}, "status codes"),
    ({"count_failures": [True]}, "status codes"),
    ({"count_failures": [[401]]}, "status codes"),
    ({"count_failures": "401"}, "must be True"),
    ({"count_failures": "tests.nowhere.judge"}, "cannot be imported"),
    ({"algorithm": "concurrency", "limit": 2, "rate": None, "count_failures": True},
     "concurrency"),
    ({"rate": "5/0.5s", "count_failures": True}, "at least 1 s"),
    ({"rate": "5/0.5s", "algorithm": "fixed_window", "count_failures": True}, "at least 1 s"),
])
def test_a_mistake_in_the_option_is_redislua_e030(options: dict[str, Any], says: str) -> None:
    options = {"rate": "3/m", "algorithm": "sliding_log", **options}
    with pytest.raises(PolicyError, match=says) as raised:
        Policy("login", **options)
    assert raised.value.check_id == "redislua.E030"


def test_a_bucket_takes_a_short_period() -> None:
    """The buckets find no window: a period under a second is theirs to have."""
    policy = Policy("burst", rate="5/0.5s", algorithm="gcra", count_failures=True)
    assert policy.count_failures is not None


def test_the_settings_check_reports_the_option() -> None:
    broken = {"login": {"rate": "3/15m", "algorithm": "sliding_log", "count_failures": "yes"}}
    with override_settings(REDISLUA={**REDISLUA, "POLICIES": broken}):
        (message,) = check_settings()
    assert message.id == "redislua.E030" and "'yes'" in message.msg
    assert "checks.html#redislua-e030" in message.hint


def test_a_configured_policy_takes_count_failures_from_settings_only() -> None:
    with pytest.raises(TypeError, match="count_failures"):
        ratelimit("failures", count_failures=[401])
