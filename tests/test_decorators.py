"""@ratelimit on real views against the real Redis test server."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import AnonymousUser
from django.test import AsyncClient, Client, override_settings
from django.test.client import RequestFactory

from django_redislua.decorators import ratelimit
from django_redislua.functions import load_scripts
from django_redislua.limiting import get_policy
from django_redislua.signals import rate_limited
from tests.testapp import ratelimit_views

pytestmark = [pytest.mark.django_db, pytest.mark.topologies]


def warm_up() -> None:
    """Load the scripts (SCRIPT FLUSH ran before the test), so a recorder sees only the call."""
    load_scripts()


def codes(client: Client, url: str, n: int, method: str = "get", **kwargs: object) -> list[int]:
    return [getattr(client, method)(url, **kwargs).status_code for _ in range(n)]


def test_inline_policy_allows_then_429_with_retry_after(client: Client) -> None:
    assert codes(client, "/rl/inline/", 3) == [200, 200, 200]
    denied = client.get("/rl/inline/")
    assert denied.status_code == 429
    # Sliding window: the previous window's weight decays, so the wait can exceed one window.
    assert 1 <= int(denied["Retry-After"]) <= 120
    assert ";r=0;" in denied["RateLimit"]


def test_allowed_responses_carry_headers(client: Client) -> None:
    response = client.get("/rl/inline/")
    assert response.status_code == 200
    assert "Retry-After" not in response
    assert ";q=3;w=60" in response["RateLimit-Policy"]
    assert ";r=2;" in response["RateLimit"]


def test_named_policy_with_method_filter(client: Client) -> None:
    # "login" is POST-only, 5/m by ip: GETs are never counted.
    assert codes(client, "/rl/login/", 10) == [200] * 10
    assert codes(client, "/rl/login/", 6, method="post") == [200] * 5 + [429]
    assert client.get("/rl/login/").status_code == 200


def test_inline_methods(client: Client) -> None:
    assert codes(client, "/rl/post-only/", 5) == [200] * 5
    assert codes(client, "/rl/post-only/", 3, method="post") == [200, 200, 429]


def test_separate_identities_are_separate_counters(client: Client) -> None:
    assert codes(client, "/rl/inline/", 4, REMOTE_ADDR="10.0.0.1") == [200, 200, 200, 429]
    assert codes(client, "/rl/inline/", 1, REMOTE_ADDR="10.0.0.2") == [200]


@pytest.mark.parametrize(("url", "first", "second"), [
    ("/rl/by-header/", {"HTTP_X_API_KEY": "a"}, {"HTTP_X_API_KEY": "b"}),
    ("/rl/by-get/", {"data": {"q": "a"}}, {"data": {"q": "b"}}),
    ("/rl/by-callable-key/", {"HTTP_X_TENANT": "a"}, {"HTTP_X_TENANT": "b"}),
    ("/rl/by-dotted-key/", {"HTTP_X_TENANT": "a"}, {"HTTP_X_TENANT": "b"}),
    ("/rl/by-user-or-ip/", {"REMOTE_ADDR": "10.1.1.1"}, {"REMOTE_ADDR": "10.1.1.2"}),
])
def test_key_types(
    client: Client, url: str, first: dict[str, object], second: dict[str, object]
) -> None:
    assert codes(client, url, 3, **first) == [200, 200, 429]
    assert codes(client, url, 1, **second) == [200]


def test_key_none_is_not_limited(client: Client) -> None:
    # A key callable giving None, or the user key for an anonymous request: not limited.
    for url in ("/rl/by-callable-key/", "/rl/by-user/"):
        assert codes(client, url, 4) == [200] * 4, url
        assert "RateLimit" not in client.get(url)


def test_a_missing_value_is_limited_under_one_shared_identity(client: Client) -> None:
    # No header / no parameter: never a way around the limit (issue 35); every such request
    # shares one budget (tests/test_request_values.py tries every layer and body form).
    for url in ("/rl/by-header/", "/rl/by-get/", "/rl/by-post/"):
        method = "post" if "post" in url else "get"
        assert codes(client, url, 3, method=method) == [200, 200, 429], url


def test_post_key(client: Client) -> None:
    assert codes(client, "/rl/by-post/", 3, method="post", data={"email": "a@x"}) == [200, 200, 429]
    assert codes(client, "/rl/by-post/", 1, method="post", data={"email": "b@x"}) == [200]


def test_user_key(client: Client, django_user_model) -> None:  # type: ignore[no-untyped-def]
    alice = django_user_model.objects.create_user("alice", password="pw")
    bob = django_user_model.objects.create_user("bob", password="pw")
    client.force_login(alice)
    assert codes(client, "/rl/by-user/", 3) == [200, 200, 429]
    assert codes(client, "/rl/by-user-or-ip/", 3) == [200, 200, 429]
    client.force_login(bob)  # same IP, another user: another counter
    assert codes(client, "/rl/by-user/", 1) == [200]
    assert codes(client, "/rl/by-user-or-ip/", 1) == [200]


@pytest.mark.parametrize("url", ["/rl/callable-rate/", "/rl/dotted-rate/"])
def test_callable_rate_none_means_unlimited(client: Client, django_user_model, url: str) -> None:  # type: ignore[no-untyped-def]
    assert codes(client, url, 3) == [200, 200, 429]
    staff = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(staff)
    assert codes(client, url, 5) == [200] * 5


@pytest.mark.parametrize(("mode", "present", "absent"), [
    ("ietf", {"RateLimit", "RateLimit-Policy"}, {"X-RateLimit-Limit"}),
    ("legacy", {"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}, {"RateLimit"}),
    ("both", {"RateLimit", "RateLimit-Policy", "X-RateLimit-Limit"}, set()),
    (None, set(), {"RateLimit", "RateLimit-Policy", "X-RateLimit-Limit"}),
])
def test_header_modes(client: Client, settings, mode, present, absent) -> None:  # type: ignore[no-untyped-def]
    settings.REDISLUA = {**settings.REDISLUA, "HEADERS": mode}
    allowed = client.get("/rl/by-header/", HTTP_X_API_KEY="m")
    client.get("/rl/by-header/", HTTP_X_API_KEY="m")
    denied = client.get("/rl/by-header/", HTTP_X_API_KEY="m")
    assert (allowed.status_code, denied.status_code) == (200, 429)
    for response in (allowed, denied):
        assert present <= set(response.headers), (mode, dict(response.headers))
        assert not absent & set(response.headers)
    assert "Retry-After" in denied and "Retry-After" not in allowed
    if mode in ("legacy", "both"):
        assert allowed["X-RateLimit-Limit"] == "2"
        assert allowed["X-RateLimit-Remaining"] == "1"
        assert denied["X-RateLimit-Remaining"] == "0"


def test_denied_view(client: Client, settings) -> None:  # type: ignore[no-untyped-def]
    settings.REDISLUA = {**settings.REDISLUA,
                         "DENIED_VIEW": "tests.testapp.ratelimit_views.denied_view"}
    codes(client, "/rl/inline/", 3)
    response = client.get("/rl/inline/")
    assert response.status_code == 429
    assert response.json()["detail"] == "slow down"
    assert re.fullmatch(r"inline-[0-9a-f]{8}", response.json()["policies"][0])
    assert int(response["Retry-After"]) >= 1  # added even though the view did not set it


def test_block_false_sets_request_attributes(client: Client) -> None:
    bodies = [client.get("/rl/not-blocking/").json() for _ in range(3)]
    assert bodies == [
        {"limited": False, "decisions": [True]},
        {"limited": False, "decisions": [True]},
        {"limited": True, "decisions": [False]},
    ]


def test_signal_on_every_denial(client: Client) -> None:
    received = []

    def receiver(sender, request, decision, **kwargs):  # type: ignore[no-untyped-def]
        received.append((sender, request.path, decision.allowed, decision.policy.name))

    rate_limited.connect(receiver)
    try:
        codes(client, "/rl/inline/", 5)
        codes(client, "/rl/not-blocking/", 3)
    finally:
        rate_limited.disconnect(receiver)
    assert [r[1] for r in received] == ["/rl/inline/", "/rl/inline/", "/rl/not-blocking/"]
    assert all(r[0] is ratelimit and r[2] is False for r in received)


def test_stacked_is_one_evalsha_and_all_or_nothing(client: Client, r, recorder) -> None:  # type: ignore[no-untyped-def]
    warm_up()
    with recorder:
        response = client.get("/rl/stacked/")
    assert response.status_code == 200
    assert recorder.commands == ["EVALSHA"]
    assert codes(client, "/rl/stacked/", 2) == [200, 429]  # the 2/m policy denies the 3rd
    # All-or-nothing: the denied request consumed nothing from the 5/m and search policies.
    wide = [k for k in r.scan_iter("rl:stack-wide:*") if b"127.0.0.1" in k]
    assert len(wide) == 1
    header = response["RateLimit-Policy"]
    assert '"stack-wide";q=5;w=60' in header and '"stack-narrow";q=2' in header
    assert '"search";q=50' in header


def test_stacked_denial_consumes_nothing(client: Client) -> None:
    assert codes(client, "/rl/stacked/", 3) == [200, 200, 429]
    response = client.get("/rl/stacked/")
    wide = next(item for item in response["RateLimit"].split(", ") if "stack-wide" in item)
    assert ";r=3;" in wide  # 2 allowed requests counted, the 2 denied ones not


def test_stacked_through_other_decorator_is_one_evalsha(client: Client, recorder) -> None:  # type: ignore[no-untyped-def]
    warm_up()
    with recorder:
        assert client.get("/rl/stacked-through/").status_code == 200
    assert recorder.commands == ["EVALSHA"]
    assert codes(client, "/rl/stacked-through/", 2) == [200, 429]


def test_concurrency_slot_released_after_response(client: Client, r) -> None:  # type: ignore[no-untyped-def]
    # limit=1: without the release after each response, the second request would be denied.
    assert codes(client, "/rl/concurrency/", 5) == [200] * 5
    assert all(r.zcard(k) == 0 for k in r.scan_iter("rl:slot:*"))


def test_concurrency_slot_released_after_streaming(client: Client, r) -> None:  # type: ignore[no-untyped-def]
    ratelimit_views.SLOT_SEEN.clear()
    for _ in range(3):
        response = client.get("/rl/concurrency-stream/")
        assert response.status_code == 200
        assert b"".join(response.streaming_content) == b"chunk"  # type: ignore[attr-defined]
        response.close()
    assert ratelimit_views.SLOT_SEEN == [0, 0, 0]  # held while the body was being sent
    assert all(r.zcard(k) == 0 for k in r.scan_iter("rl:slot-stream:*"))


# -- class-based views --------------------------------------------------------------------------
def test_class_decoration(client: Client) -> None:
    assert codes(client, "/rl/cbv/class/", 3) == [200, 200, 429]


def test_class_stacked_is_one_evalsha(client: Client, recorder) -> None:  # type: ignore[no-untyped-def]
    warm_up()
    with recorder:
        assert client.get("/rl/cbv/class-stacked/").status_code == 200
    assert recorder.commands == ["EVALSHA"]
    assert codes(client, "/rl/cbv/class-stacked/", 2) == [200, 429]


def test_method_decorator_with_methods(client: Client) -> None:
    assert codes(client, "/rl/cbv/method/", 4) == [200] * 4
    assert codes(client, "/rl/cbv/method/", 3, method="post") == [200, 200, 429]


def test_separate_method_decorators_are_one_evalsha(client: Client, recorder) -> None:  # type: ignore[no-untyped-def]
    warm_up()
    with recorder:
        response = client.get("/rl/cbv/method-stacked/")
    assert response.status_code == 200
    assert recorder.commands == ["EVALSHA"]
    assert '"md-wide"' in response["RateLimit-Policy"]
    assert '"md-narrow"' in response["RateLimit-Policy"]
    assert codes(client, "/rl/cbv/method-stacked/", 2) == [200, 429]


def test_decorating_a_non_view_class_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        ratelimit(rate="1/m")(dict)  # type: ignore[type-var]


def test_configured_policy_rejects_inline_options() -> None:
    with pytest.raises(TypeError):
        ratelimit("login", rate="1/m")


# -- async ----------------------------------------------------------------------------------------
async def test_async_view() -> None:
    client = AsyncClient()
    results = [(await client.get("/rl/async/")).status_code for _ in range(3)]
    assert results == [200, 200, 429]


async def test_async_view_makes_no_thread_hop(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The sync engine and the sync transport must not be used (they would block the loop or
    # need a thread).
    from django_redislua import transport
    from django_redislua.limiting import engine

    def forbidden(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the sync path was used by an async view")

    for module, name in ((engine, "evaluate"), (engine, "decide"),
                         (transport, "get_transport")):
        monkeypatch.setattr(module, name, forbidden)
    request = RequestFactory().get("/rl/async/")
    request.user = AnonymousUser()
    response = await ratelimit_views.async_view(request)
    assert response.status_code == 200


async def test_async_stacked_one_evalsha(recorder) -> None:  # type: ignore[no-untyped-def]
    client = AsyncClient()
    load_scripts()
    await get_policy("api").apeek("warm-up")  # this loop's connection
    with recorder:
        assert (await client.get("/rl/async-stacked/")).status_code == 200
    assert recorder.commands == ["EVALSHA"]
    statuses = [(await client.get("/rl/async-stacked/")).status_code for _ in range(2)]
    assert statuses == [200, 429]


async def test_async_class_decoration() -> None:
    client = AsyncClient()
    results = [(await client.get("/rl/cbv/async/")).status_code for _ in range(3)]
    assert results == [200, 200, 429]


async def test_async_concurrency_released() -> None:
    client = AsyncClient()
    ratelimit_views.SLOT_SEEN.clear()
    results = [(await client.get("/rl/concurrency-async/")).status_code for _ in range(3)]
    assert results == [200, 200, 200]
    assert ratelimit_views.SLOT_SEEN == [0, 0, 0]


@override_settings(REDISLUA={"CONNECTION": "redis://127.0.0.1:1/0", "HEADERS": "ietf"})
def test_settings_override_reaches_the_client(client: Client) -> None:
    # Port 1 is closed: FAIL_OPEN (default True) lets the request through.
    assert client.get("/rl/inline/").status_code == 200


def test_retry_after_only_on_denials(client) -> None:  # type: ignore[no-untyped-def]
    """A block=False rule over its limit marks the request; the 200 it still gets has nothing
    to retry, so no Retry-After (the headers still say r=0)."""
    for _ in range(3):
        response = client.get("/rl/not-blocking/")
    assert response.status_code == 200 and response.wsgi_request.limited
    assert not response.has_header("Retry-After")
    assert ";r=0;" in response["RateLimit"]


def test_public_policy_names_never_leak_module_paths(client: Client) -> None:
    """The names in RateLimit headers: group= or a short name, never "shop.views.V.get:..."."""
    for path in ("/rl/inline/", "/rl/cbv/method/", "/rl/cbv/class/", "/rl/stacked/"):
        header = client.post(path)["RateLimit-Policy"]
        assert "tests." not in header and "testapp" not in header and ":" not in header
        for item in header.split(", "):
            assert len(item.split(";")[0]) <= 52
    assert re.match(r'"MethodDecorated.post-[0-9a-f]{8}"', client.post("/rl/cbv/method/")[
        "RateLimit-Policy"])


def test_a_soft_rule_never_switches_off_the_blocking_one() -> None:
    """The issue's case: @ratelimit(rate="10/h") over @ratelimit(rate="3/m", block=False)
    admitted 50 of 50."""
    from django.http import HttpResponse
    from django.test import RequestFactory

    @ratelimit(rate="10/h", key="ip")
    @ratelimit(rate="3/m", key="ip", block=False)
    def view(request):  # type: ignore[no-untyped-def]
        return HttpResponse("ok")

    factory = RequestFactory()
    statuses = [view(factory.get("/", REMOTE_ADDR="9.9.9.9")).status_code for _ in range(50)]
    assert statuses == [200] * 10 + [429] * 40
