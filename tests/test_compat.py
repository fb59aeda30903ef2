"""django_redislua.compat: the django-ratelimit 4.x API, on real Redis."""

from __future__ import annotations

import django_ratelimit
import django_ratelimit.core
import django_ratelimit.decorators
import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.test import Client, RequestFactory, override_settings

from django_redislua import compat
from django_redislua.compat import core, decorators, exceptions, middleware
from django_redislua.compat.ratelimit import ratelimit as module_ratelimit
from django_redislua.limiting import RateLimited
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
    usage = core.get_usage(request, increment=True, **args)
    assert usage is not None
    assert usage["should_limit"] is True and usage["limit"] == 2 and usage["count"] == 3
    assert 0 <= usage["time_left"] <= 60
    assert core.is_ratelimited(request, **args) is True  # peeking: the next would be limited


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
