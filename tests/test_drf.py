"""DRF throttles on the real Redis: DRF's configuration and wait(), decided atomically."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.contrib.auth.models import User
from django.core.cache import caches
from django.test import override_settings
from django.urls import include, path
from rest_framework import routers, throttling, viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.test import APIClient, APIRequestFactory, force_authenticate
from rest_framework.views import APIView

from django_redislua import drf, get_policy
from django_redislua.conf import settings as redislua_settings
from django_redislua.limiting.inspect import log_times
from django_redislua.signals import rate_limited
from django_redislua.testing import CommandRecorder, free_port

pytestmark = pytest.mark.topologies

factory = APIRequestFactory()
ALICE = User(pk=1, username="alice")
BOB = User(pk=2, username="bob")


def rest(rates: dict[str, str | None], **extra: Any) -> override_settings:
    return override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": rates, **extra})


def redislua(**changes: Any) -> override_settings:
    from django.conf import settings

    return override_settings(REDISLUA={**settings.REDISLUA, **changes})


def view_with(*throttles: type[throttling.BaseThrottle], **attrs: Any) -> Any:
    class View(APIView):
        throttle_classes = list(throttles)
        authentication_classes: list[Any] = []

        def get(self, request: Request) -> Response:
            return Response({"ok": True})

        def post(self, request: Request) -> Response:
            return Response({"ok": True})

    for name, value in attrs.items():
        setattr(View, name, value)
    return View.as_view()


def call(view: Any, user: User | None = None, method: str = "get", **meta: Any) -> Any:
    meta.setdefault("REMOTE_ADDR", "10.0.0.1")
    request = getattr(factory, method)("/", **meta)
    if user is not None:
        force_authenticate(request, user=user)
    return view(request)


def statuses(view: Any, n: int, **kwargs: Any) -> list[int]:
    return [call(view, **kwargs).status_code for _ in range(n)]


# -- the three DRF classes ------------------------------------------------------------------------

@rest({"user": "3/m"})
def test_user_throttle_counts_per_user_and_per_address_for_anonymous() -> None:
    view = view_with(drf.UserRateThrottle)
    assert statuses(view, 4, user=ALICE) == [200, 200, 200, 429]
    assert statuses(view, 3, user=BOB) == [200, 200, 200]
    assert statuses(view, 4) == [200, 200, 200, 429]  # anonymous, by REMOTE_ADDR
    assert statuses(view, 1, REMOTE_ADDR="10.0.0.2") == [200]


@rest({"anon": "2/m"})
def test_anon_throttle_ignores_authenticated_users() -> None:
    view = view_with(drf.AnonRateThrottle)
    assert statuses(view, 3) == [200, 200, 429]
    assert statuses(view, 5, user=ALICE) == [200] * 5


@rest({"anon": "2/m", "user": "3/m"})
def test_anon_and_user_throttles_together_as_in_drf_defaults() -> None:
    view = view_with(drf.AnonRateThrottle, drf.UserRateThrottle)
    assert statuses(view, 3) == [200, 200, 429]
    assert statuses(view, 4, user=ALICE) == [200, 200, 200, 429]


@rest({"uploads": "2/m", "search": "3/m"})
def test_scoped_throttle_limits_each_scope_apart_and_skips_views_without_scope() -> None:
    uploads = view_with(drf.ScopedRateThrottle, throttle_scope="uploads")
    search = view_with(drf.ScopedRateThrottle, throttle_scope="search")
    free = view_with(drf.ScopedRateThrottle)
    assert statuses(uploads, 3, user=ALICE) == [200, 200, 429]
    assert statuses(search, 4, user=ALICE) == [200, 200, 200, 429]
    assert statuses(uploads, 2, user=BOB) == [200, 200]
    assert statuses(free, 20, user=ALICE) == [200] * 20


@rest({"user": None})
def test_a_none_rate_means_unlimited() -> None:
    assert statuses(view_with(drf.UserRateThrottle), 20) == [200] * 20


@rest({"user": "3/m"})
def test_one_throttle_decision_is_one_evalsha(recorder: CommandRecorder) -> None:
    view = view_with(drf.UserRateThrottle)
    call(view, user=ALICE)  # loads the script
    with recorder:
        assert call(view, user=ALICE).status_code == 200
    assert recorder.commands == ["EVALSHA"]


@pytest.mark.parametrize(
    ("rates", "check_id", "message"),
    [
        ({"anon": "1/m"}, "redislua.E022", "'user' scope"),
        ({"user": "3 per minute"}, "redislua.E020", "not a rate"),
        ({"user": "20/x"}, "redislua.E020", "unknown time unit"),
        ({"user": 3}, "redislua.E020", "must be a string"),
    ],
)
def test_missing_scope_rate_and_bad_rates_never_answer_500(
    rates: dict[str, Any], check_id: str, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    """DRF builds throttles per request: a wrong rate must not raise there (DRF's own classes
    raise ImproperlyConfigured, a 500). The system check reports it; requests follow FAIL_OPEN."""
    with rest(rates):
        throttle = drf.UserRateThrottle()
        assert throttle.error is not None and throttle.error.check_id == check_id
        assert message in str(throttle.error)
        view = view_with(drf.UserRateThrottle)
        with caplog.at_level("ERROR", logger="django_redislua"):
            assert statuses(view, 3) == [200, 200, 200]
        assert check_id in caplog.text
        with redislua(FAIL_OPEN=False):
            response = call(view)
        assert response.status_code == 503 and response["Retry-After"] == "1"


# -- rates, live settings, timer ------------------------------------------------------------------

class Clock:
    """A settable timer, installed on a throttle class the way DRF's own tests do."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def install(self, *classes: type[Any]) -> None:
        for cls in classes:
            cls.timer = lambda _self: self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def fresh(base: type[Any], **attrs: Any) -> type[Any]:
    """A subclass to patch (timer, cache, rates) without touching the shared class."""
    return type(f"Test{base.__name__}", (base,), attrs)


@rest({"burst": "5/10s", "sustained": "100/day", "mid": "3/15m", "word": "2/minute"})
def test_every_rate_form_of_the_engine(clock: Clock) -> None:
    with pytest.raises(KeyError):
        throttling.ScopedRateThrottle().parse_rate("5/10s")  # DRF's own cannot read it
    throttle = fresh(drf.ScopedRateThrottle)
    clock.install(throttle)
    burst = view_with(throttle, throttle_scope="burst")
    assert statuses(burst, 6, user=ALICE) == [200] * 5 + [429]
    clock.now += 9.999
    assert call(burst, user=ALICE).status_code == 429
    clock.now += 0.001
    assert statuses(burst, 6, user=ALICE) == [200] * 5 + [429]
    parser = drf.ScopedRateThrottle()
    assert parser.parse_rate("3/15m") == (3, 900.0)
    assert parser.parse_rate("100/day") == (100, 86400.0)
    assert parser.parse_rate("2/minute") == (2, 60.0)
    assert parser.parse_rate(None) == (None, None)
    sustained = view_with(throttle, throttle_scope="sustained")
    assert statuses(sustained, 3, user=ALICE) == [200] * 3


def test_rate_changes_between_requests_take_effect() -> None:
    view = view_with(drf.UserRateThrottle)
    with rest({"user": "2/m"}):
        assert statuses(view, 3, user=ALICE) == [200, 200, 429]
    with rest({"user": "4/m"}):  # the same history, a higher rate
        assert statuses(view, 3, user=ALICE) == [200, 200, 429]
    with rest({"user": None}):
        assert statuses(view, 3, user=ALICE) == [200, 200, 200]
    with rest({"user": "1/m"}):
        assert statuses(view, 1, user=ALICE) == [429]


@rest({"user": "3/m"})
def test_a_timer_override_is_the_time_written_to_redis(clock: Clock, r: redis.Redis) -> None:
    throttle = fresh(drf.UserRateThrottle)
    clock.install(throttle)
    clock.now = 1_234.5
    call(view_with(throttle), user=ALICE)
    (key,) = r.scan_iter("rl:user:sl:*")
    assert key == b"rl:user:sl:{throttle_user_1}"
    assert log_times(r.get(key)) == [1_234_500_000]


@rest({"user": "3/m"})
def test_without_a_timer_override_the_redis_clock_decides(r: redis.Redis) -> None:
    call(view_with(drf.UserRateThrottle), user=ALICE)
    (score,) = log_times(r.get("rl:user:sl:{throttle_user_1}"))
    server_now = r.time()
    assert abs(server_now[0] + server_now[1] / 1e6 - score / 1e6) < 5


def test_subclass_rates_and_fixed_rate_are_honoured() -> None:
    by_dict = fresh(drf.UserRateThrottle, THROTTLE_RATES={"user": "1/m"})
    fixed = fresh(drf.AnonRateThrottle, rate="2/m", scope="fixed")
    with rest({"user": "100/m", "anon": "100/m"}):
        assert statuses(view_with(by_dict), 2, user=ALICE) == [200, 429]
        assert statuses(view_with(fixed), 3) == [200, 200, 429]


# -- wait(): the same numbers as DRF's for the same history --------------------------------------

SCHEDULE = [0.0, 0.5, 1.25, 2.0, 2.5, 30.0, 59.5, 60.0, 60.25, 61.0, 61.5, 62.0, 119.0, 125.0]


@pytest.mark.parametrize("name", ["AnonRateThrottle", "UserRateThrottle", "ScopedRateThrottle"])
@rest({"anon": "3/m", "user": "3/m", "scoped": "3/m"})
def test_allow_and_wait_match_drf_step_by_step(name: str, clock: Clock) -> None:
    caches["locmem"].clear()
    theirs = fresh(getattr(throttling, name), cache=caches["locmem"],
                   THROTTLE_RATES={"anon": "3/m", "user": "3/m", "scoped": "3/m"})
    ours = fresh(getattr(drf, name))
    clock.install(theirs, ours)
    view = view_with(throttle_scope="scoped")
    trace = []
    for t in SCHEDULE:
        clock.now = 5_000.0 + t
        request = view.cls().initialize_request(factory.get("/", REMOTE_ADDR="10.9.9.9"))
        results = []
        for cls in (theirs, ours):
            throttle = cls()
            allowed = throttle.allow_request(request, view.cls())
            results.append((allowed, None if allowed else throttle.wait()))
        (their_ok, their_wait), (our_ok, our_wait) = results
        assert our_ok == their_ok, t
        if not their_ok:
            assert our_wait == pytest.approx(their_wait, abs=1e-6), t
        trace.append(our_ok)
    assert trace.count(False) >= 4  # the schedule does exercise denials


@rest({"user": "3/m"})
def test_wait_after_lowering_the_rate_is_exact_where_drf_has_none(clock: Clock) -> None:
    throttle = fresh(drf.UserRateThrottle)
    clock.install(throttle)
    view = view_with(throttle)
    for t in (0.0, 10.0, 20.0):
        clock.now = 1_000.0 + t
        assert call(view, user=ALICE).status_code == 200
    clock.now = 1_030.0
    with rest({"user": "1/m"}):
        response = call(view, user=ALICE)
    # DRF's wait() is None here (3 in the history, 1 allowed). A request is admitted once all
    # three have aged out: the entry of t=20 leaves at t=80, 50 s from now.
    assert response.status_code == 429
    assert response["Retry-After"] == "50"


# -- headers ---------------------------------------------------------------------------------------

@rest({"user": "2/m"})
def test_allowed_and_throttled_responses_carry_ratelimit_headers(clock: Clock) -> None:
    throttle = fresh(drf.UserRateThrottle)
    clock.install(throttle)
    view = view_with(throttle)
    first = call(view, user=ALICE)
    assert first["RateLimit-Policy"] == '"user";q=2;w=60'
    assert first["RateLimit"] == '"user";r=1;t=60'
    assert "Retry-After" not in first
    clock.now += 15
    call(view, user=ALICE)
    clock.now += 0.5
    denied = call(view, user=ALICE)
    assert denied.status_code == 429
    # t is the denial's effective window, which ends with Retry-After (draft -11 section 6):
    # a request fits again when the hit of t=0 ages out, before the state is full (t=15).
    assert denied["RateLimit"] == '"user";r=0;t=45'
    assert denied["Retry-After"] == "45"  # DRF's own, from wait() = 44.5
    assert denied.data["detail"].endswith("Expected available in 45 seconds.")


@rest({"user": "1/m"})
def test_denied_body_leaves_drf_rendering_its_own_429() -> None:
    """REDISLUA["DENIED_BODY"] shapes the decorator's and the middleware's 429 only: DRF renders
    its Throttled exception itself (its EXCEPTION_HANDLER), and the headers are still ours."""
    view = view_with(drf.UserRateThrottle)
    with redislua(DENIED_BODY="problem"):
        call(view, user=ALICE)
        denied = call(view, user=ALICE)
    assert denied.status_code == 429
    assert denied["Content-Type"] != "application/problem+json"
    assert set(denied.data) == {"detail"}
    assert denied["RateLimit"].startswith('"user";r=0;t=') and "Retry-After" in denied


@rest({"anon": "2/m", "user": "5/m"})
def test_headers_list_every_throttle_of_the_view() -> None:
    response = call(view_with(drf.AnonRateThrottle, drf.UserRateThrottle))
    assert response["RateLimit-Policy"] == '"anon";q=2;w=60, "user";q=5;w=60'
    assert response["RateLimit"] == '"anon";r=1;t=60, "user";r=4;t=60'


@rest({"user": "2/m"})
@pytest.mark.parametrize("mode", ["legacy", "both", None])
def test_header_mode_follows_redislua_headers(mode: str | None) -> None:
    with redislua(HEADERS=mode):
        response = call(view_with(drf.UserRateThrottle), user=ALICE)
    assert ("X-RateLimit-Remaining" in response) == (mode in ("legacy", "both"))
    assert ("RateLimit" in response) == (mode == "both")
    if mode is not None:
        assert response["X-RateLimit-Remaining" if mode == "legacy" else "RateLimit"]


# -- NUM_PROXIES -----------------------------------------------------------------------------------

def test_num_proxies_none_trusts_the_whole_forwarded_header() -> None:
    # DRF's default: every distinct X-Forwarded-For is a new client, so it can be spoofed.
    with rest({"anon": "1/m"}, NUM_PROXIES=None):
        view = view_with(drf.AnonRateThrottle)
        assert call(view, HTTP_X_FORWARDED_FOR="1.1.1.1").status_code == 200
        assert call(view, HTTP_X_FORWARDED_FOR="1.1.1.1").status_code == 429
        assert call(view, HTTP_X_FORWARDED_FOR="2.2.2.2").status_code == 200
        assert call(view).status_code == 200  # no header: REMOTE_ADDR


def test_num_proxies_zero_ignores_the_forwarded_header() -> None:
    with rest({"anon": "1/m"}, NUM_PROXIES=0):
        view = view_with(drf.AnonRateThrottle)
        assert call(view, HTTP_X_FORWARDED_FOR="1.1.1.1").status_code == 200
        assert call(view, HTTP_X_FORWARDED_FOR="2.2.2.2").status_code == 429  # same REMOTE_ADDR


def test_num_proxies_one_counts_the_address_the_proxy_saw() -> None:
    with rest({"anon": "1/m"}, NUM_PROXIES=1):
        view = view_with(drf.AnonRateThrottle)
        assert call(view, HTTP_X_FORWARDED_FOR="6.6.6.6, 203.0.113.7").status_code == 200
        # The client forges entries on the left; the proxy's entry on the right is kept.
        assert call(view, HTTP_X_FORWARDED_FOR="7.7.7.7, 203.0.113.7").status_code == 429
        assert call(view, HTTP_X_FORWARDED_FOR="203.0.113.7").status_code == 429
        assert call(view, HTTP_X_FORWARDED_FOR="203.0.113.8").status_code == 200
        assert call(view).status_code == 200  # no header: REMOTE_ADDR


def test_num_proxies_two_takes_the_second_from_the_right() -> None:
    with rest({"anon": "1/m"}, NUM_PROXIES=2):
        view = view_with(drf.AnonRateThrottle)
        assert call(view, HTTP_X_FORWARDED_FOR="9.9.9.9, 198.51.100.1, 10.1.1.1").status_code == 200
        assert call(view, HTTP_X_FORWARDED_FOR="8.8.8.8, 198.51.100.1, 10.1.1.2").status_code == 429


# -- FAIL_OPEN -------------------------------------------------------------------------------------

@pytest.fixture
def dead_redis() -> Iterator[None]:
    with redislua(CONNECTION=f"redis://127.0.0.1:{free_port()}/0"):
        yield


@rest({"user": "1/m"})
@pytest.mark.parametrize("fail_open", [True, False])
def test_unreachable_redis_follows_fail_open(dead_redis: None, fail_open: bool) -> None:
    with redislua(FAIL_OPEN=fail_open):
        assert redislua_settings.FAIL_OPEN is fail_open
        for throttle, attrs in ((drf.UserRateThrottle, {}),
                                (drf.PolicyThrottle, {"throttle_policy": "api"})):
            response = call(view_with(throttle, **attrs), user=ALICE)
            assert response.status_code == (200 if fail_open else 503)
            assert "RateLimit" not in response
            if not fail_open:
                assert response.data["detail"].code == "rate_limiter_unavailable"


# -- PolicyThrottle --------------------------------------------------------------------------------

def test_policy_throttle_uses_the_policy_algorithm_key_and_state(r: redis.Redis) -> None:
    view = view_with(drf.PolicyThrottle, throttle_policy="api")  # gcra, burst 20, user_or_ip
    assert statuses(view, 21, user=ALICE) == [200] * 20 + [429]
    response = call(view, user=ALICE)
    assert response["RateLimit-Policy"] == '"api";q=20;w=12'
    assert float(response["Retry-After"]) >= 0.6 - 1e-9  # one request per 0.6 s
    # The same Redis state as the policy everywhere else: one budget.
    assert get_policy("api").peek("u1").allowed is False
    assert get_policy("api").peek("u2").allowed is True
    assert statuses(view, 1, user=BOB) == [200]


def test_policy_throttle_several_policies_are_one_all_or_nothing_call(
    recorder: CommandRecorder,
) -> None:
    with redislua(POLICIES={"small": {"algorithm": "fixed_window", "rate": "2/m"},
                            "large": {"algorithm": "sliding_window", "rate": "10/m"}}):
        view = view_with(drf.PolicyThrottle, throttle_policy=["large", "small"])
        call(view, user=ALICE)
        with recorder:
            assert statuses(view, 3, user=ALICE) == [200, 429, 429]
        assert recorder.commands == ["EVALSHA"] * 3
        # the denials consumed nothing from "large": 2 of 10 used
        assert get_policy("large").peek("u1").remaining == 8


def test_policy_throttle_methods_key_and_dynamic_rate() -> None:
    with redislua(POLICIES={
        "login": {"algorithm": "sliding_log", "rate": "1/m", "key": "ip", "methods": ["POST"]},
        "perhead": {"rate": "tests.test_drf.rate_by_header", "key": "header:x-api-key"},
    }):
        login = view_with(drf.PolicyThrottle, throttle_policy="login")
        assert statuses(login, 3) == [200] * 3  # GET is not limited
        assert statuses(login, 2, method="post") == [200, 429]
        keyed = view_with(drf.PolicyThrottle, throttle_policy="perhead")
        assert statuses(keyed, 3, HTTP_X_API_KEY="gold") == [200] * 3  # rate None: unlimited
        assert statuses(keyed, 3, HTTP_X_API_KEY="k1") == [200, 200, 429]
        # no header: limited under the one shared absent identity, never skipped (issue 35)
        assert statuses(keyed, 3) == [200, 200, 429]


def rate_by_header(request: Request) -> str | None:
    return None if request.META.get("HTTP_X_API_KEY") == "gold" else "2/m"


def test_policy_throttle_views_without_a_policy_are_not_throttled() -> None:
    assert statuses(view_with(drf.PolicyThrottle), 30, user=ALICE) == [200] * 30


def test_policy_throttle_unknown_policy_follows_fail_open_and_names_the_known_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    view = view_with(drf.PolicyThrottle, throttle_policy="nope")
    with caplog.at_level("ERROR", logger="django_redislua"):
        assert statuses(view, 2) == [200, 200]
    assert "no REDISLUA policy named 'nope' (known: api, export, login, search)" in caplog.text
    assert "redislua.E021" in caplog.text
    with redislua(FAIL_OPEN=False):
        assert call(view).status_code == 503


def test_concurrency_slot_is_held_while_the_view_runs_and_released_after(r: redis.Redis) -> None:
    export = get_policy("export")  # concurrency, limit 2, key user
    seen: list[int] = []

    class Export(APIView):
        throttle_classes = [drf.PolicyThrottle]
        throttle_policy = "export"

        def get(self, request: Request) -> Response:
            seen.append(int(r.zcard(export.redis_key("u1"))))
            if request.GET.get("fail"):
                raise RuntimeError("boom")
            return Response({"ok": True})

    view = Export.as_view()
    response = call(view, user=ALICE)
    assert response.status_code == 200
    assert response["RateLimit-Policy"] == '"export";q=2;qu="concurrent-requests"'
    assert response["RateLimit"] == '"export";r=1'  # a count in flight: no time window
    assert seen == [1]
    assert r.zcard(export.redis_key("u1")) == 0

    held = [export.hit("u1"), export.hit("u1")]
    denied = call(view, user=ALICE)
    assert denied.status_code == 429
    assert 599 <= int(denied["Retry-After"]) <= 600
    assert seen == [1]  # the view did not run
    assert r.zcard(export.redis_key("u1")) == 2
    export.release("u1", held[0])
    assert call(view, user=ALICE).status_code == 200
    assert seen == [1, 2]
    assert r.zcard(export.redis_key("u1")) == 1

    with pytest.raises(RuntimeError, match="boom"):  # uncaught: still released
        view(force(factory.get("/?fail=1"), ALICE))
    assert seen == [1, 2, 2]
    assert r.zcard(export.redis_key("u1")) == 1


def force(request: Any, user: User) -> Any:
    force_authenticate(request, user=user)
    return request


# -- signal, DRF stays optional ------------------------------------------------------------------

@rest({"user": "1/m"})
def test_rate_limited_signal_is_sent_on_each_denial() -> None:
    received: list[tuple[Any, Any]] = []

    def receiver(sender: Any, request: Any, decision: Any, **kwargs: Any) -> None:
        received.append((sender, decision))

    rate_limited.connect(receiver)
    try:
        statuses(view_with(drf.UserRateThrottle), 3, user=ALICE)
    finally:
        rate_limited.disconnect(receiver)
    assert [(s, d.allowed, d.policy.name) for s, d in received] == [
        (drf.UserRateThrottle, False, "user")
    ] * 2


def test_the_app_works_without_rest_framework_installed() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["rest_framework"] = None  # as if it were not installed
        import django
        from django.conf import settings
        settings.configure(
            INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth",
                            "django_redislua"],
            REDISLUA={"CONNECTION": sys.argv[1]},
        )
        django.setup()
        from django_redislua import Policy
        from django_redislua.keys import key_function
        print(Policy("x", rate="1/m").hit("k").allowed, Policy("x", rate="1/m").hit("k").allowed)
        try:
            import django_redislua.drf
        except ImportError as exc:
            print(exc)
        """
    )
    from django.conf import settings

    result = subprocess.run(
        [sys.executable, "-c", script, settings.REDIS_URL],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "True False",
        "django_redislua.drf needs Django REST framework: pip install django-redislua[drf]",
    ]


# -- through APIClient, with a router and viewsets -----------------------------------------------

class ItemViewSet(viewsets.ViewSet):
    throttle_classes = [drf.AnonRateThrottle, drf.UserRateThrottle]

    def list(self, request: Request) -> Response:
        return Response([])


class ExportViewSet(viewsets.ViewSet):
    throttle_classes = [drf.ScopedRateThrottle, drf.PolicyThrottle]
    throttle_scope = "exports"
    throttle_policy = "api"

    def list(self, request: Request) -> Response:
        return Response([])


router = routers.SimpleRouter()
router.register("items", ItemViewSet, basename="item")
router.register("exports", ExportViewSet, basename="export")
urlpatterns = [path("api/", include(router.urls))]


@pytest.mark.urls("tests.test_drf")
@rest({"anon": "2/m", "user": "3/m", "exports": "1/10s"})
def test_viewsets_through_apiclient() -> None:
    client = APIClient()
    assert [client.get("/api/items/").status_code for _ in range(3)] == [200, 200, 429]
    client.force_authenticate(ALICE)
    assert [client.get("/api/items/").status_code for _ in range(4)] == [200, 200, 200, 429]
    first, second = client.get("/api/exports/"), client.get("/api/exports/")
    assert (first.status_code, second.status_code) == (200, 429)
    assert first["RateLimit-Policy"] == '"exports";q=1;w=10, "api";q=20;w=12'
    assert second["RateLimit"].startswith('"exports";r=0;')
    assert math.ceil(float(second["Retry-After"])) in range(9, 11)


def test_idents_are_masked_like_every_address_key() -> None:
    """One IPv6 client owns a /64: rotating through it must not buy new quota."""
    view = view_with(drf.AnonRateThrottle)
    with rest({"anon": "2/h"}):
        statuses = [call(view, REMOTE_ADDR=f"2001:db8::{i}").status_code for i in range(1, 4)]
    assert statuses == [200, 200, 429]


@pytest.mark.parametrize(("remote_addr", "ident"), [("", ""), (None, "None")])
def test_a_missing_address_is_limited_under_one_shared_identity(
    r: Any, remote_addr: str | None, ident: str
) -> None:
    """An empty or absent address: DRF's get_ident() ("" or None), so DRF's key, one counter for
    every such request; never an unlimited one."""
    view = view_with(drf.AnonRateThrottle)
    with rest({"anon": "2/h"}):
        assert statuses(view, 3, REMOTE_ADDR=remote_addr) == [200, 200, 429]
        assert r.exists(f"rl:anon:sl:{{throttle_anon_{ident}}}")


def test_a_soft_policy_never_gates_the_blocking_one_in_policy_throttle() -> None:
    from django.conf import settings

    policies = {**settings.REDISLUA["POLICIES"],
                "hard": {"rate": "5/h", "key": "ip"},
                "soft": {"rate": "2/h", "key": "ip", "block": False}}
    view = view_with(drf.PolicyThrottle, throttle_policy=["hard", "soft"])
    with redislua(POLICIES=policies):
        assert statuses(view, 7) == [200] * 5 + [429] * 2
        assert get_policy("hard").peek("10.0.0.1").remaining == 0
