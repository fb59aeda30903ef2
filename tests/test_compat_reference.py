"""django_redislua.compat side by side with the real django-ratelimit 4.1.

Each test runs the same scenario through django-ratelimit (installed in the venv, counting in
Django's RedisCache on the suite's Redis) and through compat, and compares what a caller can
observe: responses and exceptions, ``request.limited``, ``get_usage`` dicts (without compat's
extra ``decision``), the key values (IP masks included), the default groups, the rates, the
errors. django-ratelimit's clock is frozen (its windows are epoch-aligned with a per-key jitter)
at the instant its window for the scenario opens, so both start a window together; compat's
windows open at the first request (docs/migrating.md says why).
"""

from __future__ import annotations

import functools
import types
import zlib
from collections.abc import Callable
from typing import Any

import django_ratelimit
import django_ratelimit.core as rl_core
import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings
from django.utils.decorators import method_decorator
from django.views import View
from django_ratelimit.decorators import ratelimit as rl_ratelimit

from django_redislua import compat
from django_redislua.compat import core

rf = RequestFactory()
BASE = 1_700_000_000  # django-ratelimit's frozen clock starts from here


class FakeUser:
    """Just what the keys read: ``pk`` and ``is_authenticated``."""

    def __init__(self, pk: int) -> None:
        self.pk = pk
        self.is_authenticated = True


@pytest.fixture
def reference_clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, int], int]:
    """``open_window(value, period)`` freezes django-ratelimit's clock (and compat's, which
    reads it only for a rate of 0) at the second its window for ``value`` opens."""

    def open_window(value: str, period: int) -> int:
        jitter = zlib.crc32(value.encode()) % period
        now = BASE - BASE % period + (jitter + 1) % period
        clock = types.SimpleNamespace(time=lambda: float(now))
        monkeypatch.setattr(rl_core, "time", clock)
        monkeypatch.setattr(core, "time", clock, raising=False)
        return now

    open_window("", 60)
    return open_window


def request(
    method: str = "get", ip: str = "1.2.3.4", user: Any = None, query: str = "q=a",
    header: str = "h1", post: str = "v1",
) -> HttpRequest:
    factory = getattr(rf, method)
    data = {"p": post} if method == "post" else None
    req: HttpRequest = factory(
        f"/?{query}", data, REMOTE_ADDR=ip, HTTP_X_REAL_IP=ip, HTTP_X_K=header
    )
    req.user = user if user is not None else AnonymousUser()
    return req


# One sequence of varied requests, played twice against each pair of views.
ALICE = FakeUser(7)
SEQUENCE: list[dict[str, Any]] = [
    {},
    {"method": "post"},
    {"user": ALICE},
    {"ip": "1.2.3.9"},  # same /24 as 1.2.3.4
    {"ip": "2001:db8::1"},
    {"ip": "2001:db8::2", "method": "post"},  # same /64 as 2001:db8::1
    {"ip": "2001:db8:0:1::1"},  # another /64
    {"query": "q=b", "header": "h2", "post": "v2", "method": "post"},
    {"method": "put"},
    {"method": "delete", "user": ALICE},
    {"query": "", "header": ""},
    {},
]


def build_pair(**options: Any) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The same view decorated by django-ratelimit and by compat (same default group)."""

    def build(decorate: Callable[..., Any]) -> Callable[..., Any]:
        @decorate(**options)
        def view(request: HttpRequest) -> HttpResponse:
            return HttpResponse("ok")

        return view  # type: ignore[no-any-return]

    return build(rl_ratelimit), build(compat.ratelimit)


def outcome(view: Callable[..., Any], req: HttpRequest) -> tuple[object, ...]:
    try:
        view(req)
    except PermissionDenied as exc:
        return ("raised", type(exc).__name__, req.limited)  # type: ignore[attr-defined]
    return ("ok", req.limited)  # type: ignore[attr-defined]


def play(
    views: tuple[Callable[..., Any], ...], sequence: list[dict[str, Any]], rounds: int = 2
) -> list[list[tuple[object, ...]]]:
    return [
        [outcome(view, request(**spec)) for _ in range(rounds) for spec in sequence]
        for view in views
    ]


def rate_by_path(group: str, request: HttpRequest) -> str | None:
    """A rate callable reached by dotted path: unlimited for PUT, else 2 a minute."""
    return None if request.method == "PUT" else "2/m"


def key_by_path(group: str, request: HttpRequest) -> str:
    return request.META.get("HTTP_X_K", "")


SCENARIOS: dict[str, dict[str, Any]] = {
    "ip 2/m": {"key": "ip", "rate": "2/m"},
    "ip 3/h": {"key": "ip", "rate": "3/h"},
    "ip tuple": {"key": "ip", "rate": (2, 60)},
    "ip 2/10m": {"key": "ip", "rate": "2/10m"},
    "user": {"key": "user", "rate": "2/m"},
    "user_or_ip": {"key": "user_or_ip", "rate": "2/m"},
    "header": {"key": "header:x-k", "rate": "2/m"},
    "get": {"key": "get:q", "rate": "2/m"},
    "post": {"key": "post:p", "rate": "1/m"},
    "callable key": {"key": lambda group, request: request.method, "rate": "3/m"},
    "dotted key": {"key": "tests.test_compat_reference.key_by_path", "rate": "2/m"},
    "callable rate": {
        "key": "ip", "rate": lambda group, request: (1, 60) if request.user.is_authenticated
        else "3/m",
    },
    "callable rate None": {"key": "ip", "rate": lambda group, request: None},
    "dotted rate": {"key": "ip", "rate": "tests.test_compat_reference.rate_by_path"},
    "no rate": {"key": "ip", "rate": None},
    "zero": {"key": "ip", "rate": "0/m"},
    "zero tuple": {"key": "ip", "rate": (0, 60)},
    "method POST": {"key": "ip", "rate": "1/m", "method": "POST"},
    "method post": {"key": "ip", "rate": "1/m", "method": "post"},
    "method list": {"key": "ip", "rate": "2/m", "method": ["get", "post"]},
    "method ALL": {"key": "ip", "rate": "3/m", "method": compat.ALL},
    "method UNSAFE": {"key": "ip", "rate": "1/m", "method": compat.UNSAFE},
    "block False": {"key": "ip", "rate": "2/m", "block": False},
    "block False zero": {"key": "user_or_ip", "rate": "0/m", "block": False},
    "group": {"key": "ip", "rate": "2/m", "group": "a-group"},
}


NEVER_LIMITED = {"no rate", "callable rate None"}


@pytest.mark.parametrize("name", SCENARIOS)
def test_decorator_outcomes(name: str, reference_clock: Any) -> None:
    """Same responses, exceptions and request.limited for every request of the sequence."""
    reference, ours = play(build_pair(**SCENARIOS[name]), SEQUENCE)
    assert ours == reference
    limited = any(o[0] == "raised" or o[-1] is True for o in ours)
    assert limited is (name not in NEVER_LIMITED)  # the scenario does reach its limit


MASKS = {
    "defaults": {},
    "v4 /24": {"RATELIMIT_IPV4_MASK": 24},
    "v6 /48": {"RATELIMIT_IPV6_MASK": 48},
    "v6 /128, v4 /16": {"RATELIMIT_IPV6_MASK": 128, "RATELIMIT_IPV4_MASK": 16},
    "meta key": {"RATELIMIT_IP_META_KEY": "HTTP_X_REAL_IP", "RATELIMIT_IPV4_MASK": 24},
    "meta callable": {
        "RATELIMIT_IP_META_KEY": lambda r: r.META["HTTP_X_REAL_IP"], "RATELIMIT_IPV6_MASK": 32,
    },
    "meta dotted path": {
        "RATELIMIT_IP_META_KEY": "tests.test_compat_reference.real_ip", "RATELIMIT_IPV4_MASK": 8,
    },
}


def real_ip(request: HttpRequest) -> str:
    return str(request.META["HTTP_X_REAL_IP"])


@pytest.mark.parametrize("key", ["ip", "user_or_ip"])
@pytest.mark.parametrize("mask_settings", MASKS.values(), ids=MASKS.keys())
def test_ip_masks_apply_to_ip_keys_and_meta_key_values(
    key: str, mask_settings: dict[str, Any], reference_clock: Any
) -> None:
    addresses = ["1.2.3.4", "1.2.3.200", "1.2.200.1", "1.200.3.4", "2001:db8::1",
                 "2001:db8::ffff", "2001:db8:0:1::1", "2001:db8:1::1", "2001:db9::1"]
    with override_settings(**mask_settings):
        for address in addresses:
            req = rf.get("/", REMOTE_ADDR=address, HTTP_X_REAL_IP=address)
            req.user = AnonymousUser()
            expected = rl_core._SIMPLE_KEYS[key](req)
            usage = core.get_usage(req, group="g", key=key, rate="5/m", increment=True)
            assert usage is not None
            assert usage["decision"].key == expected  # the value compat counts under
            assert core.get_ip(req) == rl_core._get_ip(req)
        # Requests are counted together exactly when their masked addresses are equal.
        views = build_pair(key=key, rate="1/h")
        sequence = [{"ip": a} for a in addresses]
        reference, ours = play(views, sequence, rounds=1)
        assert ours == reference


@pytest.mark.parametrize(("mask_settings", "empty_error"), [
    ({}, ImproperlyConfigured), ({"RATELIMIT_IP_META_KEY": "HTTP_X_REAL_IP"}, ValueError),
])
def test_ip_errors(mask_settings: dict[str, Any], empty_error: type[Exception]) -> None:
    """An empty REMOTE_ADDR or a META key the request lacks: ImproperlyConfigured; a value that
    is not an address: ValueError."""
    with override_settings(**mask_settings):
        for address, error in (("", empty_error), ("not-an-ip", ValueError),
                               ("1.2.3.4:80", ValueError)):
            req = rf.get("/", REMOTE_ADDR=address, HTTP_X_REAL_IP=address)
            for get_ip in (rl_core._get_ip, core.get_ip):
                with pytest.raises(error):
                    get_ip(req)
    with override_settings(RATELIMIT_IP_META_KEY="HTTP_X_MISSING"):
        for get_ip in (rl_core._get_ip, core.get_ip):
            with pytest.raises(ImproperlyConfigured):
                get_ip(rf.get("/"))


KEY_SPECS = ["ip", "user", "user_or_ip", "header:x-k", "header:X_K", "get:q", "get:missing",
             "post:p", "post:missing"]


@pytest.mark.parametrize("spec", KEY_SPECS)
@pytest.mark.parametrize("who", [None, ALICE], ids=["anonymous", "authenticated"])
def test_key_values(spec: str, who: Any) -> None:
    """Each key type reads the same value (anonymous `user` is the string "None")."""
    req = request("post", user=who, header="hv", post="pv")
    if ":" in spec:
        accessor, name = spec.split(":", 1)
        expected = rl_core._ACCESSOR_KEYS[accessor](req, name)
    else:
        expected = rl_core._SIMPLE_KEYS[spec](req)
    usage = core.get_usage(req, group="g", key=spec, rate="5/m")
    assert usage is not None and usage["decision"].key == expected


def _without_decision(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if usage is None else {k: v for k, v in usage.items() if k != "decision"}


def assert_same_usage(reference: dict[str, Any] | None, ours: dict[str, Any] | None) -> None:
    """Equal dicts; ``time_left`` may be one second lower in ours (compat's window is on the
    Redis clock, which moves while the test runs; django-ratelimit's is frozen)."""
    ours = _without_decision(ours)
    if reference is None or ours is None:
        assert ours == reference
        return
    assert ours.keys() == reference.keys()
    assert {k: v for k, v in ours.items() if k != "time_left"} == {
        k: v for k, v in reference.items() if k != "time_left"}
    assert reference["time_left"] - 1 <= ours["time_left"] <= reference["time_left"]


CALLS = [False, True, False, True, True, False, True, True, False]  # increment per call


@pytest.mark.parametrize("rate", ["2/m", "1/h", (3, 60), "3/10s", "2/5s"])
def test_get_usage_counts_and_time_left(rate: Any, reference_clock: Any) -> None:
    """count (after the increment; denied requests count too; increment=False only reads),
    limit, should_limit (count > limit) and time_left (whole seconds until the window ends)."""
    period = core.split_rate(rate)[1]
    reference_clock("1.2.3.4", period)
    req = request()
    args = {"group": "usage", "key": "ip", "rate": rate}
    for increment in CALLS:
        reference = rl_core.get_usage(req, increment=increment, **args)
        ours = core.get_usage(req, increment=increment, **args)
        assert_same_usage(reference, ours)
        assert rl_core.is_ratelimited(req, **args) is core.is_ratelimited(req, **args)
    assert ours is not None and ours["count"] == CALLS.count(True)  # 5 counted, 2 allowed


@pytest.mark.parametrize("rate", ["1/s", "5/s", (5, 1)])
def test_time_left_of_one_second_windows(rate: Any, reference_clock: Any) -> None:
    """A one-second window has 0 seconds left (django-ratelimit's window is the second itself)."""
    req = request()
    args = {"group": "second", "key": "ip", "rate": rate, "increment": True}
    reference = rl_core.get_usage(req, **args)
    assert reference is not None and reference["time_left"] == 0
    assert _without_decision(core.get_usage(req, **args)) == reference


@pytest.mark.parametrize("increment", [True, False])
@pytest.mark.parametrize("rate", ["0/m", (0, 60), "0/s", "0/1h"])
def test_zero_rate_get_usage(rate: Any, increment: bool, reference_clock: Any) -> None:
    """A zero count limits: the first call's dict is django-ratelimit's, time_left included."""
    reference_clock("1.2.3.4", core.split_rate(rate)[1])
    req = request()
    args = {"group": "zero", "key": "ip", "rate": rate, "increment": increment}
    reference = rl_core.get_usage(req, **args)
    ours = core.get_usage(req, **args)
    assert reference is not None and ours is not None
    if increment:
        assert _without_decision(ours) == reference
    else:
        # Documented difference: django-ratelimit reads the stored count (0 here, so not limited
        # until a request was counted); compat stores nothing and says "limited" at once.
        assert _without_decision(ours) == {**reference, "should_limit": True}
        assert reference["should_limit"] is False


@pytest.mark.parametrize("rate", [
    "5/m", "100/10s", "5/", "5/10", "5/minute", "5/hour", "5/day", "5/sec", "5/x", "5/M",
    "1/2h", "10/30m", "7/1d", "0/m", "0/s", "5/0s", (4, 30), (0, 60), (5, 0),
])
def test_split_rate(rate: Any) -> None:
    """Same reading of every rate form (even "5/M": per second, as django-ratelimit reads it)."""
    assert core.split_rate(rate) == rl_core._split_rate(rate)


@pytest.mark.parametrize("rate", ["5/0s", "3/0", (5, 0), (5, -1)])
def test_zero_period_is_improperly_configured(rate: Any) -> None:
    for get_usage in (rl_core.get_usage, core.get_usage):
        with pytest.raises(ImproperlyConfigured):
            get_usage(request(), group="g", key="ip", rate=rate)


@pytest.mark.parametrize("kwargs", [
    {"key": "ip", "rate": "1/m"},  # neither group nor fn
    {"group": "g", "rate": "1/m"},  # no key
    {"group": "g", "key": "", "rate": "1/m"},
    {"group": "g", "key": "cookie:x", "rate": "1/m"},  # unknown accessor
    {"group": "g", "key": "ipaddress", "rate": "1/m"},  # not a key
])
def test_configuration_errors(kwargs: dict[str, Any]) -> None:
    for get_usage in (rl_core.get_usage, core.get_usage):
        with pytest.raises(ImproperlyConfigured):
            get_usage(request(), **kwargs)


def test_no_rate_means_no_key_is_read() -> None:
    """rate None (or a callable returning None): None before the key is even looked at."""
    for get_usage in (rl_core.get_usage, core.get_usage):
        assert get_usage(request(), group="g", rate=None) is None
        assert get_usage(request(), group="g", rate=lambda g, r: None) is None


def _capture_group(decorate: Callable[..., Any], seen: list[str]) -> Callable[..., Any]:
    def key(group: str, request: HttpRequest) -> str:
        seen.append(group)
        return "k"

    return functools.partial(decorate, key=key, rate="100/m")


def _groups(make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> tuple[str, str]:
    seen: list[str] = []
    for decorate in (rl_ratelimit, compat.ratelimit):
        make(_capture_group(decorate, seen))(request())
    assert len(seen) == 2
    return seen[0], seen[1]


def test_default_group_of_a_function() -> None:
    def make(decorate: Callable[..., Any]) -> Callable[..., Any]:
        @decorate()
        def view(request: HttpRequest) -> HttpResponse:
            return HttpResponse()

        return view  # type: ignore[no-any-return]

    reference, ours = _groups(make)
    name = "test_default_group_of_a_function.<locals>.make.<locals>.view"
    assert ours == reference == f"{__name__}.{name}"


class Base(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse()


def test_default_group_of_a_method_decorator_view() -> None:
    """method_decorator hands the decorator a partial of a bound method: the group then has
    the instance's class name before the method's qualified name."""

    def make(decorate: Callable[..., Any]) -> Callable[..., Any]:
        @method_decorator(decorate(), name="get")
        class Child(Base):
            pass

        return Child.as_view()

    reference, ours = _groups(make)
    assert ours == reference == f"{__name__}.Child.Base.get"


def test_default_group_of_a_partial() -> None:
    def view(request: HttpRequest, extra: int) -> HttpResponse:
        return HttpResponse()

    seen: list[str] = []
    for get_usage in (rl_core.get_usage, core.get_usage):
        get_usage(request(), fn=functools.partial(view, extra=1),
                  key=lambda g, r: seen.append(g) or "k", rate="1/m")
    assert seen[0] == seen[1] == f"{__name__}.test_default_group_of_a_partial.<locals>.view"


def test_shared_group_shares_counters_per_rate_and_method_set(reference_clock: Any) -> None:
    """Views with one group share a counter only when their rates and method sets match."""

    def views(decorate: Callable[..., Any]) -> list[Callable[..., Any]]:
        made = []
        for options in ({"rate": "2/m"}, {"rate": "2/m"}, {"rate": (2, 60)}, {"rate": "3/m"},
                        {"rate": "2/m", "method": ["GET", "POST"]},
                        {"rate": "2/m", "method": ("post", "get")},
                        {"rate": "2/m", "method": "GET"}, {"rate": "2/m", "method": "get"}):
            @decorate(group="shared", key="ip", **options)
            def view(request: HttpRequest) -> HttpResponse:
                return HttpResponse()

            made.append(view)
        return made

    reference_views, our_views = views(rl_ratelimit), views(compat.ratelimit)
    for _ in range(2):
        for reference_view, our_view in zip(reference_views, our_views, strict=True):
            assert outcome(our_view, request()) == outcome(reference_view, request())


def test_request_limited_stays_true_once_set(reference_clock: Any) -> None:
    """Stacked decorators: one that limits (block=False) leaves request.limited True even when
    the next one does not limit; a decorator that does not apply sets it to False."""

    def stacked(decorate: Callable[..., Any]) -> Callable[..., Any]:
        @decorate(key="ip", rate="5/m", block=False)
        @decorate(key="ip", rate="1/m", block=False)
        @decorate(key="ip", rate="5/m", block=False, method="POST")
        def view(request: HttpRequest) -> HttpResponse:
            return HttpResponse()

        return view  # type: ignore[no-any-return]

    reference, ours = play((stacked(rl_ratelimit), stacked(compat.ratelimit)), [{}] * 3, 1)
    assert ours == reference == [("ok", False), ("ok", True), ("ok", True)]
    for decorate in (rl_ratelimit, compat.ratelimit):
        req = request()
        decorate(key="ip", rate="1/m", method="POST")(lambda r: HttpResponse())(req)
        assert req.limited is False  # type: ignore[attr-defined]


def test_ratelimit_enable_false(reference_clock: Any) -> None:
    with override_settings(RATELIMIT_ENABLE=False):
        reference, ours = play(build_pair(key="ip", rate="0/m"), [{}, {}])
        assert ours == reference == [("ok", False)] * 4
        for get_usage in (rl_core.get_usage, core.get_usage):
            assert get_usage(request(), group="g", key="ip", rate="1/m") is None


class CustomDenied(Exception):
    pass


@pytest.mark.parametrize("exception_class", [CustomDenied, f"{__name__}.CustomDenied"])
def test_exception_class_setting(exception_class: Any, reference_clock: Any) -> None:
    with override_settings(RATELIMIT_EXCEPTION_CLASS=exception_class):
        for view in build_pair(key="ip", rate="1/m"):
            view(request())
            with pytest.raises(CustomDenied):
                view(request())


def test_ratelimited_exception() -> None:
    import django_ratelimit.exceptions as rl_exceptions

    for cls in (rl_exceptions.Ratelimited, compat.Ratelimited):
        assert issubclass(cls, PermissionDenied)
        assert str(cls()) == "" and str(cls("slow down")) == "slow down"
        assert cls("a", "b").args == ("a", "b")


def test_all_and_unsafe_everywhere() -> None:
    assert compat.ALL == django_ratelimit.ALL and compat.UNSAFE == django_ratelimit.UNSAFE
    for name in ("is_ratelimited", "get_usage"):
        for attr in ("ALL", "UNSAFE"):
            assert getattr(getattr(core, name), attr) == getattr(getattr(rl_core, name), attr)
    assert compat.ratelimit.ALL == rl_ratelimit.ALL  # type: ignore[attr-defined]
    assert compat.ratelimit.UNSAFE == rl_ratelimit.UNSAFE  # type: ignore[attr-defined]
    assert rl_core.__all__ == core.__all__
