"""django_redislua.compat: the django-ratelimit 4.x API, on real Redis."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import django_ratelimit
import django_ratelimit.core
import django_ratelimit.decorators
import pytest
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory, override_settings

from django_redislua import compat
from django_redislua.compat import core, decorators, exceptions, middleware
from django_redislua.compat.ratelimit import ratelimit as module_ratelimit
from django_redislua.limiting import RateLimited
from django_redislua.signals import rate_limited
from django_redislua.testing import free_port
from tests.settings import MIDDLEWARE

pytestmark = pytest.mark.django_db
rf = RequestFactory()


def test_same_public_names_as_django_ratelimit() -> None:
    assert compat.ALL == django_ratelimit.ALL and compat.UNSAFE == django_ratelimit.UNSAFE
    assert compat.ratelimit is decorators.ratelimit is module_ratelimit
    assert compat.ratelimit.ALL == django_ratelimit.decorators.ratelimit.ALL  # type: ignore[attr-defined]
    for name in django_ratelimit.core.__all__:
        assert callable(getattr(core, name))
    assert issubclass(exceptions.Ratelimited, PermissionDenied)
    assert issubclass(exceptions.Ratelimited, RateLimited)


def test_decorator_raises_ratelimited_which_middleware_turns_into_429(client: Client) -> None:
    compat_mw = "django_redislua.compat.middleware.RatelimitMiddleware"
    with override_settings(MIDDLEWARE=[*MIDDLEWARE, compat_mw]):
        statuses = [client.get("/rl/compat/") for _ in range(3)]
    assert [r.status_code for r in statuses] == [200, 200, 429]
    assert int(statuses[2]["Retry-After"]) >= 1


def test_without_middleware_it_is_a_403_like_django_ratelimit(client: Client) -> None:
    assert [client.get("/rl/compat/").status_code for _ in range(3)] == [200, 200, 403]


def test_our_middleware_also_answers_429(client: Client) -> None:
    ours = "django_redislua.middleware.RateLimitMiddleware"
    with override_settings(MIDDLEWARE=[*MIDDLEWARE, ours]):
        assert [client.get("/rl/compat/").status_code for _ in range(3)] == [200, 200, 429]


def test_block_false_sets_limited(client: Client) -> None:
    limited = [client.get("/rl/compat/not-blocking/").json()["limited"] for _ in range(3)]
    assert limited == [False, False, True]


def test_is_ratelimited_and_get_usage() -> None:
    request = rf.get("/", REMOTE_ADDR="1.2.3.4")
    args = {"group": "g", "key": "ip", "rate": "2/m"}
    assert core.get_usage(request, **args)["count"] == 0  # type: ignore[index]
    assert core.is_ratelimited(request, increment=True, **args) is False
    assert core.is_ratelimited(request, increment=True, **args) is False
    # A look says whether the count is already above the limit (django-ratelimit), not whether
    # the next request would be: at the limit, it is not yet.
    assert core.is_ratelimited(request, **args) is False
    usage = core.get_usage(request, increment=True, **args)
    assert usage is not None
    assert usage["should_limit"] is True and usage["limit"] == 2 and usage["count"] == 3
    assert 0 <= usage["time_left"] <= 59
    assert core.is_ratelimited(request, **args) is True


def test_key_and_rate_callables_get_group_and_request() -> None:
    seen = []

    def key(group, request):  # type: ignore[no-untyped-def]
        seen.append(("key", group))
        return request.GET.get("who")

    def rate(group, request):  # type: ignore[no-untyped-def]
        seen.append(("rate", group))
        return None if request.GET.get("who") == "staff" else (1, 60)

    staff, other = rf.get("/?who=staff"), rf.get("/?who=other")
    assert not core.is_ratelimited(staff, group="cb", key=key, rate=rate, increment=True)
    assert not core.is_ratelimited(other, group="cb", key=key, rate=rate, increment=True)
    assert core.is_ratelimited(other, group="cb", key=key, rate=rate, increment=True)
    assert ("rate", "cb") in seen and ("key", "cb") in seen


def test_method_filter_and_key_strings() -> None:
    post = rf.post("/?q=1", {"p": "v"}, HTTP_X_K="h", REMOTE_ADDR="1.2.3.4")
    get = rf.get("/?q=1", REMOTE_ADDR="1.2.3.4")
    post.user = get.user = AnonymousUser()
    for key in ("ip", "get:q", "post:p", "header:x-k", "user_or_ip"):
        args = {"group": key, "key": key, "rate": "1/m", "method": compat.UNSAFE}
        assert core.get_usage(get, **args) is None
        assert not core.is_ratelimited(post, increment=True, **args)
        assert core.is_ratelimited(post, increment=True, **args)


@pytest.mark.parametrize(("rate", "expected"), [
    ("5/m", (5, 60)), ("100/10s", (100, 10)), ("3/", (3, 1)), ("1/2h", (1, 7200)),
    ((4, 30), (4, 30)),
])
def test_split_rate(rate: object, expected: tuple[int, int]) -> None:
    assert core.split_rate(rate) == expected  # type: ignore[arg-type]


def test_errors_match_django_ratelimit() -> None:
    request = rf.get("/")
    with pytest.raises(ImproperlyConfigured):
        core.get_usage(request, key="ip", rate="1/m")  # neither group nor fn
    with pytest.raises(ImproperlyConfigured):
        core.get_usage(request, group="g", rate="1/m")  # no key
    with pytest.raises(ImproperlyConfigured):
        core.get_usage(request, group="g", key="cookie:x", rate="1/m")


@override_settings(RATELIMIT_ENABLE=False)
def test_ratelimit_enable_false() -> None:
    assert core.get_usage(rf.get("/"), group="g", key="ip", rate="1/m") is None


@override_settings(RATELIMIT_VIEW="tests.testapp.ratelimit_views.denied_view")
def test_ratelimit_view_setting() -> None:
    request = rf.get("/")
    response = middleware.RatelimitMiddleware(lambda r: None).process_exception(
        request, exceptions.Ratelimited()
    )
    assert response is not None and response.status_code == 429
    view = compat.ratelimit(key="ip", rate="1/m")(lambda r: HttpResponse("ok"))
    view(request)
    with pytest.raises(exceptions.Ratelimited) as raised:
        view(request)
    response = middleware.RatelimitMiddleware(lambda r: None).process_exception(
        request, raised.value
    )
    assert response is not None and response.status_code == 429  # what the view answers
    assert 1 <= int(response["Retry-After"]) <= 60 and ";q=1;w=60" in response["RateLimit-Policy"]


def test_headers_name_no_module_path() -> None:
    """The default group is the view's module path (django-ratelimit's counter name); the
    headers show only its last part and a digest, as the native decorator's inline names do."""
    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.77")

    def hello(request: object) -> HttpResponse:
        return HttpResponse("ok")

    view = compat.ratelimit(key="ip", rate="1/m")(hello)
    view(request)
    with pytest.raises(exceptions.Ratelimited) as raised:
        view(request)
    response = middleware.RatelimitMiddleware(lambda r: None).process_exception(
        request, raised.value)
    assert response is not None
    policy = response["RateLimit-Policy"]
    assert re.fullmatch(r'"hello-[0-9a-f]{8}";q=1;w=60', policy), policy
    assert "tests" not in response["RateLimit"] and "compat:" not in policy


# -- behaviours of compat itself (tests/test_compat_reference.py compares with django-ratelimit) --
def _anonymous(request: HttpRequest) -> HttpRequest:
    request.user = AnonymousUser()
    return request


@pytest.mark.parametrize("rate", ["0/m", (0, 60), "0/s", (-1, 60)])
def test_zero_rate_denies_every_request_without_redis(rate: object, recorder: Any) -> None:
    request = _anonymous(rf.get("/", REMOTE_ADDR="1.2.3.4"))
    view = compat.ratelimit(key="ip", rate=rate)(lambda r: HttpResponse("ok"))
    soft = compat.ratelimit(key="ip", rate=rate, block=False)(
        lambda r: HttpResponse(str(r.limited))
    )
    with recorder:
        for _ in range(3):
            with pytest.raises(exceptions.Ratelimited):
                view(request)
            assert soft(request).content == b"True"
        usage = core.get_usage(request, group="z", key="ip", rate=rate, increment=True)
        peek = core.get_usage(request, group="z", key="ip", rate=rate)
        assert core.is_ratelimited(request, group="z", key="ip", rate=rate)
    assert recorder.commands == []  # decided without Redis
    assert usage is not None and peek is not None
    assert (usage["count"], usage["should_limit"]) == (1, True)
    assert (peek["count"], peek["should_limit"]) == (0, True)
    assert usage["limit"] == peek["limit"] == (rate[0] if isinstance(rate, tuple) else 0)
    assert 0 <= usage["time_left"] < core.split_rate(rate)[1]  # type: ignore[arg-type]


def test_zero_rate_through_the_middleware_is_a_429_without_retry_after() -> None:
    request = _anonymous(rf.get("/"))
    view = compat.ratelimit(key="ip", rate="0/m")(lambda r: HttpResponse("ok"))
    with pytest.raises(exceptions.Ratelimited) as raised:
        view(request)
    response = middleware.RatelimitMiddleware(lambda r: None).process_exception(
        request, raised.value
    )
    assert response is not None and response.status_code == 429
    assert "Retry-After" not in response  # no wait would help


def test_one_round_trip_per_call_and_the_429_shows_the_real_limit(
    client: Client, recorder: Any
) -> None:
    request = rf.get("/", REMOTE_ADDR="1.2.3.4")
    core.get_usage(request, group="warm-up", key="ip", rate="1/m")  # the script is loaded
    with recorder:
        core.get_usage(request, group="g", key="ip", rate="2/m", increment=True)
        core.get_usage(request, group="g", key="ip", rate="2/m")
    assert recorder.commands == ["EVALSHA", "EVALSHA"]
    compat_mw = "django_redislua.compat.middleware.RatelimitMiddleware"
    with override_settings(MIDDLEWARE=[*MIDDLEWARE, compat_mw]):
        responses = [client.get("/rl/compat/") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert ";q=2;w=60" in responses[2]["RateLimit-Policy"]
    assert 1 <= int(responses[2]["Retry-After"]) <= 60


def test_denied_requests_keep_counting_and_time_left_counts_down_the_window() -> None:
    request = rf.get("/", REMOTE_ADDR="1.2.3.4")
    args = {"group": "g", "key": "ip", "rate": "2/m"}
    fresh = core.get_usage(request, **args)
    assert fresh is not None and fresh["count"] == 0 and fresh["time_left"] == 59
    counts = []
    for _ in range(5):
        usage = core.get_usage(request, increment=True, **args)
        assert usage is not None
        counts.append((usage["count"], usage["should_limit"]))
        assert usage["time_left"] in (58, 59)  # the window opened at the first request
        assert usage["decision"].limit == 2 and usage["decision"].allowed is not usage[
            "should_limit"]
    assert counts == [(1, False), (2, False), (3, True), (4, True), (5, True)]
    one_second = core.get_usage(request, group="s", key="ip", rate="5/s", increment=True)
    assert one_second is not None and one_second["time_left"] == 0


def test_signal_on_each_counted_denial() -> None:
    seen: list[tuple[object, int]] = []

    def receiver(sender: object, request: HttpRequest, decision: Any, **kwargs: Any) -> None:
        seen.append((sender, decision.limit))

    request = rf.get("/")
    rate_limited.connect(receiver)
    try:
        for _ in range(3):
            core.get_usage(request, group="g", key="ip", rate="1/m", increment=True)
        core.get_usage(request, group="g", key="ip", rate="1/m")  # a look: no signal
        core.get_usage(request, group="z", key="ip", rate="0/m", increment=True)
    finally:
        rate_limited.disconnect(receiver)
    assert seen == [(core.get_usage, 1), (core.get_usage, 1), (core.get_usage, 0)]


@pytest.fixture
def dead_redis() -> Iterator[None]:
    with override_settings(REDISLUA={
        "CONNECTION": f"redis://127.0.0.1:{free_port()}/0",
        "SOCKET_TIMEOUT": 0.3, "SOCKET_CONNECT_TIMEOUT": 0.3,
    }):
        yield


@pytest.mark.parametrize(("ratelimit_fail_open", "redislua_fail_open", "open_"), [
    (True, False, True), (False, True, False), (None, True, True), (None, False, False),
])
def test_fail_open_when_redis_is_down(
    dead_redis: None, ratelimit_fail_open: bool | None, redislua_fail_open: bool, open_: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """RATELIMIT_FAIL_OPEN when set, else REDISLUA["FAIL_OPEN"]. Open: None (not limited);
    closed: django-ratelimit's dict for a cache that cannot count, so the request is limited."""
    overrides: dict[str, Any] = {"REDISLUA": {**settings.REDISLUA, "FAIL_OPEN": redislua_fail_open}}
    if ratelimit_fail_open is not None:
        overrides["RATELIMIT_FAIL_OPEN"] = ratelimit_fail_open
    request = _anonymous(rf.get("/"))
    view = compat.ratelimit(key="ip", rate="5/m", block=False)(lambda r: HttpResponse("ok"))
    with override_settings(**overrides), caplog.at_level(logging.WARNING, "django_redislua"):
        usage = core.get_usage(request, group="g", key="ip", rate="5/m", increment=True)
        view(request)
    if open_:
        assert usage is None and request.limited is False  # type: ignore[attr-defined]
    else:
        assert usage == {"count": 0, "limit": 0, "should_limit": True, "time_left": -1}
        assert request.limited is True  # type: ignore[attr-defined]
    assert "unreachable" in caplog.text


@override_settings(
    RATELIMIT_USE_CACHE="no-such-cache", RATELIMIT_CACHE_PREFIX="other:",
    RATELIMIT_HASH_ALGORITHM="hashlib.md5",
)
def test_cache_settings_have_no_effect() -> None:
    """Counting is in REDISLUA["CONNECTION"] under REDISLUA["KEY_PREFIX"] whatever these say."""
    request = rf.get("/")
    args = {"group": "g", "key": "ip", "rate": "1/m", "increment": True}
    assert [core.is_ratelimited(request, **args) for _ in range(2)] == [False, True]


def test_ratelimited_built_by_hand_or_by_the_decorator() -> None:
    assert str(exceptions.Ratelimited()) == "" and exceptions.Ratelimited().decisions == []
    assert exceptions.Ratelimited("why").args == ("why",)
    request = rf.get("/")
    view = compat.ratelimit(key="ip", rate="1/m")(lambda r: HttpResponse("ok"))
    view(request)
    with pytest.raises(exceptions.Ratelimited) as raised:
        view(request)
    assert [d.limit for d in raised.value.decisions] == [1]
    assert raised.value.retry_after > 0


def test_middleware_leaves_other_exceptions_alone() -> None:
    mw = middleware.RatelimitMiddleware(lambda r: None)
    assert mw.process_exception(rf.get("/"), PermissionDenied()) is None
    assert mw.process_exception(rf.get("/"), RateLimited([])) is None


def test_key_values_that_are_not_strings() -> None:
    """Documented leniency: django-ratelimit needs a str; compat counts None as "" and others
    as their str()."""
    request = rf.get("/")
    for value, identity in ((None, ""), (7, "7"), (b"b", "b")):
        usage = core.get_usage(request, group="g", key=lambda g, r, v=value: v, rate="1/m")
        assert usage is not None and usage["decision"].key == identity


def test_malformed_rate_is_improperly_configured() -> None:
    """Documented difference: django-ratelimit fails with an AttributeError."""
    for rate in ("m/5", "", [5, 60]):
        with pytest.raises(ImproperlyConfigured):
            core.get_usage(rf.get("/"), group="g", key="ip", rate=rate)


@override_settings(REDISLUA={**settings.REDISLUA, "TRUSTED_PROXIES": 1},
                   RATELIMIT_IPV4_MASK=24)
def test_trusted_proxies_extension_then_django_ratelimit_masks() -> None:
    """Not in django-ratelimit: with REDISLUA["TRUSTED_PROXIES"] (and no RATELIMIT_IP_META_KEY)
    the address is the one the trusted proxy saw, then masked as django-ratelimit masks."""
    request = rf.get("/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="6.6.6.6, 203.0.113.7")
    assert core.get_ip(request) == "203.0.113.0"
    with override_settings(RATELIMIT_IP_META_KEY="REMOTE_ADDR"):
        assert core.get_ip(request) == "10.0.0.0"


async def test_async_decorator_and_functions() -> None:
    @compat.ratelimit(key="ip", rate="1/m", block=False)
    async def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse(str(request.limited))  # type: ignore[attr-defined]

    request = rf.get("/", REMOTE_ADDR="1.2.3.4")
    assert [(await view(request)).content for _ in range(2)] == [b"False", b"True"]
    usage = await core.aget_usage(request, group="a", key="ip", rate="1/m", increment=True)
    assert usage is not None and usage["count"] == 1
    assert await core.ais_ratelimited(request, group="a", key="ip", rate="1/m", increment=True)
