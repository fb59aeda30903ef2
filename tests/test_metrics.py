"""Metrics (issue 14), end to end: traffic through every layer, then both sinks read back.

Traffic goes through the decorator (sync, async, and async under WSGI), the middleware, DRF
(``PolicyThrottle`` and the global ``AnonRateThrottle``/``UserRateThrottle``), shadow policies,
the compat decorator, the Python API, local denials, a Redis outage (FAIL_OPEN on and off) and
locks. Then ``prometheus_client.generate_latest()`` (parsed, and cross-checked with
``REGISTRY.get_sample_value``) and an OpenTelemetry ``InMemoryMetricReader`` are read: every
counter moved by exactly what happened, both sinks agree, and no label holds an identity.

Prometheus counters live in the process-wide default registry and the OpenTelemetry reader is
cumulative, so every test compares a snapshot taken before its traffic with one taken after.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.core.checks import run_checks
from django.http import HttpRequest, HttpResponse
from django.test import override_settings
from django.test.client import RequestFactory
from opentelemetry import metrics as otel_api
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory, force_authenticate
from rest_framework.views import APIView

from django_redislua import drf, metric_backends, metrics
from django_redislua.checks import check_settings
from django_redislua.compat import Ratelimited, get_usage, is_ratelimited
from django_redislua.compat import ratelimit as compat_ratelimit
from django_redislua.decorators import ratelimit
from django_redislua.jobs import JobGate
from django_redislua.jobs.gate import RAN, RATE_LIMITED, SKIPPED
from django_redislua.limiting import Policy, evaluate
from django_redislua.limiting.definition import ALGORITHMS
from django_redislua.locks import (
    LeaseLost,
    Lock,
    LockNotAcquired,
    LockNotOwned,
    LockUnavailable,
    run_once,
    single_flight,
)
from django_redislua.middleware import RateLimitMiddleware
from django_redislua.testing import CommandRecorder, RedisServer, free_port
from tests.settings import REDISLUA as BASE
from tests.settings import REST_FRAMEWORK as BASE_REST

# Identities the traffic below uses: none may ever show up in a label.
IP = "203.0.113.77"
IP6 = "2001:db8:beef:77::1"
API_KEY = "tok-SECRET-9f3k"
USER_PK = 7654321
DIRECT_ID = "id-SECRET-direct"
LOCK_NAME = "lock-SECRET-name"
IDENTITY_MARKS = ("203.0.113", "2001:db8", "SECRET", str(USER_PK), "9f3k")

rf = RequestFactory()
api = APIRequestFactory()

DECISIONS = ("redislua_decisions_total", "redislua.decisions")
SECONDS = ("redislua_decision_seconds_count", "redislua.decision.duration")
ERRORS = ("redislua_redis_errors_total", "redislua.redis.errors")
ACQUIRED = ("redislua_lock_acquired_total", "redislua.lock.acquired")
WAIT = ("redislua_lock_wait_seconds_count", "redislua.lock.wait.duration")
LOST = ("redislua_lock_lost_total", "redislua.lock.lost")
OTEL_NAMES = {
    "redislua.decisions": {"policy", "algorithm", "result"},
    "redislua.decision.duration": {"policy"},
    "redislua.redis.errors": {"operation"},
    "redislua.lock.acquired": {"result"},
    "redislua.lock.wait.duration": set(),
    "redislua.lock.lost": set(),
    "redislua.jobs": {"job", "outcome"},
}
PROM_LABELS = {  # sample name -> its label names (buckets add "le")
    "redislua_decisions_total": {"policy", "algorithm", "result"},
    "redislua_decision_seconds_bucket": {"policy", "le"},
    "redislua_decision_seconds_count": {"policy"},
    "redislua_decision_seconds_sum": {"policy"},
    "redislua_redis_errors_total": {"operation"},
    "redislua_lock_acquired_total": {"result"},
    "redislua_lock_wait_seconds_bucket": {"le"},
    "redislua_lock_wait_seconds_count": set(),
    "redislua_lock_wait_seconds_sum": set(),
    "redislua_lock_lost_total": set(),
    "redislua_jobs_total": {"job", "outcome"},
}


# -- settings helpers -----------------------------------------------------------------------------

def redislua(**changes: Any) -> override_settings:
    """REDISLUA as it is now (the test settings, or an enclosing override), with ``changes``."""
    return override_settings(REDISLUA={**django_settings.REDISLUA, **changes})


def with_policies(**policies: dict[str, Any]) -> override_settings:
    return redislua(POLICIES={**BASE["POLICIES"], **policies})  # type: ignore[dict-item]


def inline_name() -> str:
    """The public name of ``inline_view``'s inline policy (one decision, on another address)."""
    request = rf.get("/mx/", REMOTE_ADDR="192.0.2.1")
    inline_view(request)
    return str(request.ratelimit[0].policy.name)  # type: ignore[attr-defined]


def outage(url: str, fail_open: bool, **changes: Any) -> override_settings:
    return redislua(CONNECTION=url, FAIL_OPEN=fail_open, SOCKET_TIMEOUT=0.3,
                    SOCKET_CONNECT_TIMEOUT=0.3, **changes)


@pytest.fixture
def down() -> str:
    """A Redis URL nobody listens on: every connection is refused at once."""
    return f"redis://127.0.0.1:{free_port()}/0"


# -- reading both sinks ---------------------------------------------------------------------------

Key = tuple[str, frozenset[tuple[str, str]]]
EARLY_INSTRUMENTS: list[str] = []  # the OpenTelemetry sink's instruments before the provider


def prom_text() -> str:
    return generate_latest(REGISTRY).decode()


def prom_samples() -> dict[Key, float]:
    """Every redislua_* sample of the default registry (``_created`` timestamps left out)."""
    found: dict[Key, float] = {}
    for family in text_string_to_metric_families(prom_text()):
        if not family.name.startswith("redislua_"):
            continue
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def otel_points(reader: InMemoryMetricReader) -> dict[Key, Any]:
    """Every data point of the meter ``django_redislua``, by instrument and attributes."""
    found: dict[Key, Any] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            if scope.scope.name != "django_redislua":
                continue
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    found[(metric.name, frozenset(dict(point.attributes or {}).items()))] = point
    return found


def otel_value(point: Any) -> float:
    return point.count if isinstance(point, HistogramDataPoint) else point.value


class Delta:
    """What moved between two snapshots; each accessor checks both sinks agree."""

    def __init__(self, before: Snapshot, after: Snapshot) -> None:
        self.before, self.after = before, after

    def _prom(self, sample: str, labels: tuple[str, ...]) -> dict[tuple[str, ...], float]:
        moved: dict[tuple[str, ...], float] = {}
        keys = {k for k in (*self.before.prom, *self.after.prom) if k[0] == sample}
        for key in keys:
            label_map = dict(key[1])
            assert set(label_map) == set(labels), (sample, label_map)
            value = self.after.prom.get(key, 0.0)
            change = value - self.before.prom.get(key, 0.0)
            if change:
                # The parsed text and the registry's own lookup agree.
                assert REGISTRY.get_sample_value(sample, label_map) == value, (sample, label_map)
                moved[tuple(label_map[name] for name in labels)] = change
        return moved

    def _otel(self, name: str, labels: tuple[str, ...]) -> dict[tuple[str, ...], float]:
        moved: dict[tuple[str, ...], float] = {}
        keys = {k for k in (*self.before.otel, *self.after.otel) if k[0] == name}
        for key in keys:
            attributes = dict(key[1])
            assert set(attributes) == set(labels), (name, attributes)
            after = self.after.otel.get(key)
            before = self.before.otel.get(key)
            change = (otel_value(after) if after is not None else 0) - (
                otel_value(before) if before is not None else 0)
            if change:
                moved[tuple(attributes[label] for label in labels)] = change
        return moved

    def both(self, names: tuple[str, str], labels: tuple[str, ...]) -> dict[Any, int]:
        prom, otel = self._prom(names[0], labels), self._otel(names[1], labels)
        assert prom == otel, f"prometheus {prom} != opentelemetry {otel}"
        if labels == ():
            return {(): int(prom.get((), 0))}  # type: ignore[dict-item]
        return {k if len(k) > 1 else k[0]: int(v) for k, v in prom.items()}

    # -- the accessors tests use -------------------------------------------------------------
    def decisions(self) -> dict[tuple[str, str, str], int]:
        """{(policy, algorithm, result): n} for every decision counted meanwhile."""
        return self.both(DECISIONS, ("policy", "algorithm", "result"))

    def results(self, policy: str) -> dict[str, int]:
        """{result: n} of one policy."""
        return {result: n for (name, _alg, result), n in self.decisions().items()
                if name == policy}

    def timed(self) -> dict[str, int]:
        """{policy: observations} of the decision latency histogram."""
        timed = self.both(SECONDS, ("policy",))
        inf = self._prom("redislua_decision_seconds_bucket", ("policy", "le"))
        assert {p: int(n) for (p, le), n in inf.items() if le == "+Inf"} == timed
        return timed

    def errors(self) -> dict[str, int]:
        return self.both(ERRORS, ("operation",))

    def acquired(self) -> dict[str, int]:
        return self.both(ACQUIRED, ("result",))

    def waits(self) -> int:
        return self.both(WAIT, ())[()]  # type: ignore[index]

    def wait_seconds(self) -> float:
        key: Key = ("redislua_lock_wait_seconds_sum", frozenset())
        return self.after.prom.get(key, 0.0) - self.before.prom.get(key, 0.0)

    def lost(self) -> int:
        return self.both(LOST, ())[()]  # type: ignore[index]

    def nothing(self) -> bool:
        """No redislua sample nor data point moved at all."""
        return self._moved_prom() == set() and self._moved_otel() == set()

    def _moved_prom(self) -> set[Key]:
        keys = set(self.before.prom) | set(self.after.prom)
        return {k for k in keys if self.after.prom.get(k, 0.0) != self.before.prom.get(k, 0.0)}

    def _moved_otel(self) -> set[Key]:
        keys = set(self.before.otel) | set(self.after.otel)

        def value(points: dict[Key, Any], key: Key) -> float:
            return otel_value(points[key]) if key in points else 0

        return {k for k in keys if value(self.after.otel, k) != value(self.before.otel, k)}


class Snapshot:
    def __init__(self, reader: InMemoryMetricReader) -> None:
        self.prom = prom_samples()
        self.otel = otel_points(reader)


class Meter:
    """``meter.delta()``: what moved in both sinks since the test began (or since ``mark``)."""

    def __init__(self, reader: InMemoryMetricReader) -> None:
        self.reader = reader
        self.start = Snapshot(reader)

    def mark(self) -> None:
        self.start = Snapshot(self.reader)

    def delta(self) -> Delta:
        return Delta(self.start, Snapshot(self.reader))


@pytest.fixture(scope="session")
def otel_reader() -> InMemoryMetricReader:
    """The global MeterProvider (set once per process) with an in-memory reader.

    The library's OpenTelemetry sink is created first, from the API's proxy meter, as in a
    project that configures OpenTelemetry after Django started: its instruments must bind to
    the provider set afterwards.
    """
    current = otel_api.get_meter_provider()
    assert not isinstance(current, MeterProvider), "another test set the global MeterProvider"
    sink: Any = metrics._sink(metrics.OPENTELEMETRY)
    EARLY_INSTRUMENTS.extend(type(i).__name__ for i in (sink._decisions, sink._seconds))
    reader = InMemoryMetricReader()
    otel_api.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader


@pytest.fixture(autouse=True)
def _only_this_tests_series() -> None:
    """The Prometheus series this test's snapshots render and parse are its own, not every
    policy's of the tests this process ran before it (measured: they made each test here 3x
    slower late in the suite). Cleared in the registry and in the sink's cache of children
    together, so what this test records is exported."""
    if not metric_backends.installed(metrics.PROMETHEUS):
        return
    sink = metrics._sink(metrics.PROMETHEUS)
    assert isinstance(sink, metrics._Prometheus)
    for metric in {key[0] for key in sink._children}:
        metric.clear()
    sink._children.clear()
    sink._decided.clear()


@pytest.fixture
def meter(otel_reader: InMemoryMetricReader) -> Meter:
    return Meter(otel_reader)


# -- views ----------------------------------------------------------------------------------------

def ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


async def aok(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def get(view: Callable[[HttpRequest], Any], n: int, path: str = "/mx/", **meta: Any) -> list[int]:
    meta.setdefault("REMOTE_ADDR", IP)
    return [view(rf.get(path, **meta)).status_code for _ in range(n)]


def api_view(*throttles: type[Any] | None, **attrs: Any) -> Any:
    """An APIView; no ``throttles`` given keeps DRF's global DEFAULT_THROTTLE_CLASSES."""
    body: dict[str, Any] = {
        "authentication_classes": [],
        "get": lambda self, request: Response({"ok": True}),
        **attrs,
    }
    if throttles:
        body["throttle_classes"] = list(throttles)
    return type("MetricsView", (APIView,), body).as_view()


def api_get(view: Any, n: int, user: User | None = None) -> list[int]:
    codes = []
    for _ in range(n):
        request = api.get("/mx/", REMOTE_ADDR=IP)
        if user is not None:
            force_authenticate(request, user=user)
        codes.append(view(request).status_code)
    return codes


USER = User(pk=USER_PK, username="mx-user")
STATUS = {200: "allowed", 429: "denied"}


def by_status(codes: list[int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for code in codes:
        counts[STATUS[code]] = counts.get(STATUS[code], 0) + 1
    return counts


# -- the OpenTelemetry side is really bound -------------------------------------------------------

def test_otel_instruments_made_before_the_provider_bind_to_it(
    otel_reader: InMemoryMetricReader, meter: Meter
) -> None:
    assert EARLY_INSTRUMENTS and all("Proxy" in name for name in EARLY_INSTRUMENTS)
    Policy("mx-bind", rate="2/h", algorithm="sliding_log").hit(DIRECT_ID)
    delta = meter.delta()
    assert delta.decisions() == {("mx-bind", "sliding_log", "allowed"): 1}
    assert delta.timed() == {"mx-bind": 1}
    points = otel_points(otel_reader)
    names = {name for name, _attrs in points}
    assert {"redislua.decisions", "redislua.decision.duration"} <= names <= set(OTEL_NAMES)
    histogram = points[("redislua.decision.duration", frozenset({("policy", "mx-bind")}))]
    # The bucket advice survived the proxy: the SDK uses the library's boundaries.
    assert tuple(histogram.explicit_bounds) == metrics.DECISION_BUCKETS
    assert histogram.sum > 0


# -- the decorator --------------------------------------------------------------------------------

@ratelimit(rate="3/h", key="ip", algorithm="sliding_log")
def inline_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def test_sync_decorator_inline_rate(meter: Meter) -> None:
    request = rf.get("/mx/", REMOTE_ADDR=IP)
    assert inline_view(request).status_code == 200
    name = request.ratelimit[0].policy.name  # type: ignore[attr-defined]
    assert name.startswith("inline_view-")  # the inline policy's public name, nothing else
    assert get(inline_view, 4) == [200, 200, 429, 429]
    delta = meter.delta()
    assert delta.decisions() == {(name, "sliding_log", "allowed"): 3,
                                 (name, "sliding_log", "denied"): 2}
    assert delta.timed() == {name: 5}
    assert delta.errors() == {}


@pytest.mark.parametrize("algorithm", sorted(set(ALGORITHMS) - {"concurrency"}))
def test_configured_policy_every_algorithm_counts_what_was_answered(
    meter: Meter, algorithm: str
) -> None:
    name = f"mx-conf-{algorithm}"
    view = ratelimit(name)(ok)
    with with_policies(**{name: {"algorithm": algorithm, "rate": "2/h",
                                 "key": "header:x-api-key"}}):
        codes = get(view, 5, HTTP_X_API_KEY=API_KEY)
    assert codes == [200, 200, 429, 429, 429]
    delta = meter.delta()
    assert delta.decisions() == {(name, algorithm, r): n for r, n in by_status(codes).items()}
    assert delta.timed() == {name: 5}


def test_concurrency_policy_counts_slots(meter: Meter) -> None:
    policy = Policy("mx-slots", algorithm="concurrency", limit=1)
    held = policy.hit(DIRECT_ID)  # the only slot, held outside the view
    view = ratelimit(rate=None, limit=1, algorithm="concurrency", key="header:x-api-key",
                     group="mx-slots")(ok)
    assert get(view, 2, HTTP_X_API_KEY=DIRECT_ID) == [429, 429]
    policy.release(DIRECT_ID, held)
    assert get(view, 3, HTTP_X_API_KEY=DIRECT_ID) == [200, 200, 200]  # released after each
    delta = meter.delta()
    assert delta.decisions() == {("mx-slots", "concurrency", "allowed"): 4,
                                 ("mx-slots", "concurrency", "denied"): 2}
    assert delta.timed() == {"mx-slots": 6}


@ratelimit(rate="2/h", key="ip", algorithm="sliding_log", group="mx-async")
async def async_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


async def test_async_view_on_the_asyncio_client(meter: Meter) -> None:
    codes = [(await async_view(rf.get("/mx/", REMOTE_ADDR=IP))).status_code for _ in range(4)]
    assert codes == [200, 200, 429, 429]
    delta = meter.delta()
    assert delta.decisions() == {("mx-async", "sliding_log", "allowed"): 2,
                                 ("mx-async", "sliding_log", "denied"): 2}
    assert delta.timed() == {"mx-async": 4}


def test_async_view_under_wsgi_on_a_throwaway_loop(meter: Meter) -> None:
    codes = [async_to_sync(async_view)(rf.get("/mx/", REMOTE_ADDR=IP)).status_code
             for _ in range(3)]
    assert codes == [200, 200, 429]
    delta = meter.delta()
    assert delta.decisions() == {("mx-async", "sliding_log", "allowed"): 2,
                                 ("mx-async", "sliding_log", "denied"): 1}
    assert delta.timed() == {"mx-async": 3}


def test_stacked_decorators_one_call_each_policy_counted_once(meter: Meter) -> None:
    view = ratelimit(rate="2/h", key="ip", algorithm="sliding_log", group="mx-outer")(
        ratelimit(rate="10/h", key="ip", algorithm="gcra", group="mx-inner")(ok))
    assert get(view, 4) == [200, 200, 429, 429]
    delta = meter.delta()
    # The inner policy allows every time (its answer), but consumes only when the gate opens.
    assert delta.decisions() == {("mx-outer", "sliding_log", "allowed"): 2,
                                 ("mx-outer", "sliding_log", "denied"): 2,
                                 ("mx-inner", "gcra", "allowed"): 4}
    assert delta.timed() == {"mx-outer": 4, "mx-inner": 4}


def test_disabled_layers_count_nothing(meter: Meter) -> None:
    """``ENABLED = False``: the decorator, the middleware, DRF and compat decide nothing."""
    middleware = RateLimitMiddleware(ok)
    drf_view = api_view(drf.PolicyThrottle, throttle_policy="mx-mw-tight")
    with middleware_settings(), redislua(ENABLED=False):
        assert get(inline_view, 5) == [200] * 5
        assert get(middleware, 5) == [200] * 5
        assert api_get(drf_view, 5, user=USER) == [200] * 5
        assert api_get(api_view(), 2) == [200] * 2  # the global throttles
        assert [compat_view(rf.get("/mx/", REMOTE_ADDR=IP)).content for _ in range(3)] == (
            [b"ok"] * 3)
    assert meter.delta().nothing()


# -- the middleware -------------------------------------------------------------------------------

MW_POLICIES = {
    "mx-mw-tight": {"rate": "3/h", "key": "ip", "algorithm": "sliding_log"},
    "mx-mw-wide": {"rate": "50/h", "key": "ip", "algorithm": "token_bucket"},
    "mx-mw-other": {"rate": "5/h", "key": "ip"},
}
MW_RULES = [
    {"path": "/mx/", "policy": "mx-mw-tight"},
    {"path": "/mx/", "policy": "mx-mw-wide"},
    {"path": "/elsewhere/", "policy": "mx-mw-other"},
]


def middleware_settings() -> override_settings:
    return redislua(POLICIES={**BASE["POLICIES"], **MW_POLICIES},  # type: ignore[dict-item]
                    MIDDLEWARE_POLICIES=MW_RULES)


def test_middleware_two_policies_in_one_call(meter: Meter) -> None:
    middleware = RateLimitMiddleware(ok)
    with middleware_settings():
        assert get(middleware, 5) == [200, 200, 200, 429, 429]
        assert get(middleware, 3, path="/unlimited/") == [200] * 3  # no rule: nothing counted
    delta = meter.delta()
    assert delta.decisions() == {("mx-mw-tight", "sliding_log", "allowed"): 3,
                                 ("mx-mw-tight", "sliding_log", "denied"): 2,
                                 ("mx-mw-wide", "token_bucket", "allowed"): 5}
    assert delta.timed() == {"mx-mw-tight": 5, "mx-mw-wide": 5}


async def test_async_middleware(meter: Meter) -> None:
    middleware = RateLimitMiddleware(aok)
    with middleware_settings():
        codes = [(await middleware(rf.get("/mx/", REMOTE_ADDR=IP6))).status_code
                 for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    delta = meter.delta()
    assert delta.decisions() == {("mx-mw-tight", "sliding_log", "allowed"): 3,
                                 ("mx-mw-tight", "sliding_log", "denied"): 1,
                                 ("mx-mw-wide", "token_bucket", "allowed"): 4}
    assert delta.timed() == {"mx-mw-tight": 4, "mx-mw-wide": 4}


def test_a_policy_reached_by_two_rules_is_one_decision(meter: Meter) -> None:
    middleware = RateLimitMiddleware(ok)
    rules = [{"path": "/", "policy": "mx-twice"}, {"path": "/mx/", "policy": "mx-twice"}]
    with redislua(POLICIES={"mx-twice": {"rate": "2/h", "key": "ip", "algorithm": "sliding_log"}},
                  MIDDLEWARE_POLICIES=rules):
        assert get(middleware, 3) == [200, 200, 429]  # one state, consumed once per request
    delta = meter.delta()
    assert delta.timed() == {"mx-twice": 3}
    assert delta.decisions() == {("mx-twice", "sliding_log", "allowed"): 2,
                                 ("mx-twice", "sliding_log", "denied"): 1}


# -- DRF ------------------------------------------------------------------------------------------

def test_drf_policy_throttle(meter: Meter) -> None:
    view = api_view(drf.PolicyThrottle, throttle_policy="mx-drf")
    with with_policies(**{"mx-drf": {"rate": "2/h", "key": "user", "algorithm": "gcra"}}):
        codes = api_get(view, 4, user=USER)
    assert codes == [200, 200, 429, 429]
    delta = meter.delta()
    assert delta.decisions() == {("mx-drf", "gcra", "allowed"): 2, ("mx-drf", "gcra", "denied"): 2}
    assert delta.timed() == {"mx-drf": 4}


def test_drf_global_anon_and_user_throttles(meter: Meter) -> None:
    view = api_view()  # DRF's DEFAULT_THROTTLE_CLASSES: this app's Anon + User throttles
    rates = {**BASE_REST, "DEFAULT_THROTTLE_RATES": {"anon": "2/h", "user": "1000/h"}}
    with override_settings(REST_FRAMEWORK=rates):
        anonymous = api_get(view, 3)
        signed_in = api_get(view, 2, user=USER)
    assert anonymous == [200, 200, 429]
    assert signed_in == [200, 200]
    delta = meter.delta()
    # DRF asks every throttle, even after one said no; the anon throttle skips signed-in users.
    assert delta.decisions() == {("anon", "sliding_log", "allowed"): 2,
                                 ("anon", "sliding_log", "denied"): 1,
                                 ("user", "sliding_log", "allowed"): 5}
    assert delta.timed() == {"anon": 3, "user": 5}


# -- shadow policies ------------------------------------------------------------------------------

SHADOW = {"rate": "2/h", "key": "ip", "algorithm": "sliding_log", "mode": "shadow"}


def test_shadow_policy_counts_shadow_denied_and_blocks_nothing(meter: Meter) -> None:
    view = ratelimit("mx-shadow")(ok)
    with with_policies(**{"mx-shadow": SHADOW}):
        requests = [rf.get("/mx/", REMOTE_ADDR=IP) for _ in range(5)]
        responses = [view(request) for request in requests]
    assert [r.status_code for r in responses] == [200] * 5
    headers = {name.lower() for response in responses for name in response.headers}
    assert not {h for h in headers if h.startswith(("ratelimit", "x-ratelimit", "retry-after"))}
    assert [[d.allowed for d in r.ratelimit_shadow] for r in requests] == (  # type: ignore[attr-defined]
        [[True], [True], [False], [False], [False]])
    assert not any(getattr(r, "limited", False) for r in requests)
    delta = meter.delta()
    assert delta.decisions() == {("mx-shadow", "sliding_log", "allowed"): 2,
                                 ("mx-shadow", "sliding_log", "shadow_denied"): 3}
    assert delta.timed() == {"mx-shadow": 5}


def test_shadow_next_to_an_enforced_policy(meter: Meter) -> None:
    view = ratelimit("mx-shadow")(ratelimit(rate="3/h", key="ip", group="mx-enforced")(ok))
    with with_policies(**{"mx-shadow": {**SHADOW, "rate": "1/h"}}):
        assert get(view, 5) == [200, 200, 200, 429, 429]
    delta = meter.delta()
    assert delta.decisions() == {("mx-shadow", "sliding_log", "allowed"): 1,
                                 ("mx-shadow", "sliding_log", "shadow_denied"): 4,
                                 ("mx-enforced", "sliding_window", "allowed"): 3,
                                 ("mx-enforced", "sliding_window", "denied"): 2}


def test_shadow_in_middleware_and_drf(meter: Meter) -> None:
    middleware = RateLimitMiddleware(ok)
    view = api_view(drf.PolicyThrottle, throttle_policy="mx-shadow-drf")
    policies = {"mx-shadow-mw": SHADOW, "mx-shadow-drf": {**SHADOW, "key": "user"}}
    with redislua(POLICIES=policies, MIDDLEWARE_POLICIES=[{"path": "/", "policy": "mx-shadow-mw"}]):
        assert get(middleware, 4) == [200] * 4
        assert api_get(view, 4, user=USER) == [200] * 4
    delta = meter.delta()
    assert delta.decisions() == {("mx-shadow-mw", "sliding_log", "allowed"): 2,
                                 ("mx-shadow-mw", "sliding_log", "shadow_denied"): 2,
                                 ("mx-shadow-drf", "sliding_log", "allowed"): 2,
                                 ("mx-shadow-drf", "sliding_log", "shadow_denied"): 2}


def test_outage_does_not_let_a_shadow_policy_block(meter: Meter, down: str) -> None:
    view = ratelimit("mx-shadow")(ok)
    middleware = RateLimitMiddleware(ok)
    drf_view = api_view(drf.PolicyThrottle, throttle_policy="mx-shadow")
    stacked = ratelimit("mx-shadow")(ratelimit(rate="3/h", key="ip", group="mx-enforced")(ok))
    with outage(down, False, POLICIES={"mx-shadow": SHADOW},
                MIDDLEWARE_POLICIES=[{"path": "/", "policy": "mx-shadow"}]):
        codes = [*get(view, 2), *get(middleware, 2), *api_get(drf_view, 2, user=USER)]
        with_enforced = get(stacked, 2)
    # A dry run changes nothing ("never blocks"): without the policy these requests pass, so
    # they are admitted undecided: failed_open, even with FAIL_OPEN off.
    assert codes == [200] * 6
    # Next to an enforced policy the request is refused for the enforced one's sake.
    assert with_enforced == [503, 503]
    assert meter.delta().decisions() == {
        ("mx-shadow", "sliding_log", "failed_open"): 6,
        ("mx-shadow", "sliding_log", "unavailable"): 2,
        ("mx-enforced", "sliding_window", "unavailable"): 2,
    }


# -- compat (django-ratelimit's API) --------------------------------------------------------------

@compat_ratelimit(key="ip", rate="2/h", block=False)
def compat_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("limited" if request.limited else "ok")  # type: ignore[attr-defined]


@compat_ratelimit(key="ip", rate="2/h", block=True)
def compat_blocking(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def compat_name(view: Callable[..., Any], rate: str = "2/3600s") -> str:
    group = f"{__name__}.{view.__qualname__}"
    return f"compat:{group}:{rate}:"


def test_compat_decorator_counts_once_per_request(meter: Meter) -> None:
    bodies = [compat_view(rf.get("/mx/", REMOTE_ADDR=IP)).content for _ in range(4)]
    assert bodies == [b"ok", b"ok", b"limited", b"limited"]
    blocking = [compat_blocking(rf.get("/mx/", REMOTE_ADDR=IP)).status_code for _ in range(2)]
    with pytest.raises(Ratelimited):
        compat_blocking(rf.get("/mx/", REMOTE_ADDR=IP))
    assert blocking == [200, 200]
    delta = meter.delta()
    # Its own count, and only that: the engine call behind it is not metered a second time.
    assert delta.decisions() == {
        (compat_name(compat_view), "fixed_window", "allowed"): 2,
        (compat_name(compat_view), "fixed_window", "denied"): 2,
        (compat_name(compat_blocking), "fixed_window", "allowed"): 2,
        (compat_name(compat_blocking), "fixed_window", "denied"): 1,
    }


def test_compat_functions_peeks_and_zero_rates(meter: Meter) -> None:
    request = rf.get("/mx/", REMOTE_ADDR=IP)
    for _ in range(3):
        assert not is_ratelimited(request, group="mx-compat", key="ip", rate="5/h")  # a look
    assert meter.delta().nothing()
    usage = get_usage(request, group="mx-compat", key="ip", rate="5/h", increment=True)
    assert usage is not None and usage["count"] == 1
    assert is_ratelimited(request, group="mx-compat-zero", key="ip", rate="0/h", increment=True)
    assert is_ratelimited(request, group="mx-compat-zero", key="ip", rate="0/h")  # not counted
    assert meter.delta().decisions() == {
        ("compat:mx-compat:5/3600s:", "fixed_window", "allowed"): 1,
        ("compat:mx-compat-zero:0/3600s:", "fixed_window", "denied"): 1,
    }


# -- the Python API -------------------------------------------------------------------------------

def test_hit_is_counted_peek_is_not(meter: Meter) -> None:
    policy = Policy("mx-direct", rate="2/h", algorithm="sliding_log")
    for _ in range(3):
        policy.peek(DIRECT_ID)
    evaluate([(policy, DIRECT_ID, 1), (policy, "other-SECRET", 1)], peek=True)
    assert meter.delta().nothing()
    assert [policy.hit(DIRECT_ID).allowed for _ in range(4)] == [True, True, False, False]
    policy.peek(DIRECT_ID)
    other = Policy("mx-direct-other", rate="5/h", algorithm="leaky_bucket")
    decisions = evaluate([(policy, DIRECT_ID, 1), (other, DIRECT_ID, 1)])
    assert [d.allowed for d in decisions] == [False, True]
    delta = meter.delta()
    assert delta.decisions() == {("mx-direct", "sliding_log", "allowed"): 2,
                                 ("mx-direct", "sliding_log", "denied"): 3,
                                 ("mx-direct-other", "leaky_bucket", "allowed"): 1}
    assert delta.timed() == {"mx-direct": 5, "mx-direct-other": 1}


async def test_async_hit_is_counted_apeek_is_not(meter: Meter) -> None:
    policy = Policy("mx-direct-async", rate="1/h", algorithm="fixed_window")
    await policy.apeek(DIRECT_ID)
    assert meter.delta().nothing()
    assert [(await policy.ahit(DIRECT_ID)).allowed for _ in range(3)] == [True, False, False]
    await policy.apeek(DIRECT_ID)
    delta = meter.delta()
    assert delta.results("mx-direct-async") == {"allowed": 1, "denied": 2}
    assert delta.timed() == {"mx-direct-async": 3}


def test_what_no_wait_can_admit_is_denied_and_counted(meter: Meter) -> None:
    zero = Policy("mx-zero", rate="0/h", algorithm="gcra")
    assert [zero.hit(DIRECT_ID).allowed for _ in range(3)] == [False] * 3
    small = Policy("mx-small", rate="2/h", algorithm="token_bucket")
    assert not small.hit(DIRECT_ID, cost=3).allowed  # a cost above the capacity
    assert small.hit(DIRECT_ID, cost=2).allowed
    delta = meter.delta()
    assert delta.decisions() == {("mx-zero", "gcra", "denied"): 3,
                                 ("mx-small", "token_bucket", "denied"): 1,
                                 ("mx-small", "token_bucket", "allowed"): 1}
    assert delta.timed() == {"mx-zero": 3, "mx-small": 2}


def test_exact_under_concurrent_threads(meter: Meter) -> None:
    policy = Policy("mx-threads", rate="100/h", algorithm="sliding_log")
    results: list[bool] = []
    lock = threading.Lock()

    def work() -> None:
        mine = [policy.hit(DIRECT_ID).allowed for _ in range(25)]
        with lock:
            results.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results.count(True) == 100
    delta = meter.delta()
    assert delta.decisions() == {("mx-threads", "sliding_log", "allowed"): 100,
                                 ("mx-threads", "sliding_log", "denied"): 100}
    assert delta.timed() == {"mx-threads": 200}


def test_a_caller_mistake_is_no_decision(meter: Meter) -> None:
    policy = Policy("mx-mistake", rate="2/h")
    with pytest.raises(ValueError):
        policy.hit(DIRECT_ID, cost=0)  # refused before Redis is asked: no decision was made
    delta = meter.delta()
    assert delta.decisions() == {}
    assert delta.errors() == {}
    assert delta.timed() == {}  # the latency histogram has no failed *decision* to show


# -- local denials --------------------------------------------------------------------------------

@pytest.mark.parametrize("local_deny", [True, False])
def test_local_denials_count_as_denied(meter: Meter, r: redis.Redis, local_deny: bool) -> None:
    view = ratelimit(rate="1/h", key="ip", algorithm="sliding_log", group="mx-local")(ok)
    with redislua(LOCAL_DENY=local_deny):
        get(view, 1)
        with CommandRecorder(r) as recorder:
            assert get(view, 9) == [429] * 9
    round_trips = len([c for c in recorder.commands if c in ("EVALSHA", "EVAL", "FCALL")])
    if local_deny:
        assert 1 <= round_trips < 9  # most answered in this process
    else:
        assert round_trips == 9
    delta = meter.delta()
    assert delta.decisions() == {("mx-local", "sliding_log", "allowed"): 1,
                                 ("mx-local", "sliding_log", "denied"): 9}
    assert delta.timed() == {"mx-local": 10}


# -- Redis outages --------------------------------------------------------------------------------

@pytest.mark.parametrize(("fail_open", "status", "result"),
                         [(True, 200, "failed_open"), (False, 503, "unavailable")])
def test_outage_through_every_layer(meter: Meter, down: str, fail_open: bool, status: int,
                                    result: str) -> None:
    name = inline_name()
    meter.mark()
    middleware = RateLimitMiddleware(ok)
    drf_view = api_view(drf.PolicyThrottle, throttle_policy="mx-out-drf")
    policies = {**BASE["POLICIES"], **MW_POLICIES,  # type: ignore[dict-item]
                "mx-out-drf": {"rate": "2/h", "key": "user", "algorithm": "gcra"}}
    with outage(down, fail_open, POLICIES=policies, MIDDLEWARE_POLICIES=MW_RULES):
        assert get(inline_view, 3) == [status] * 3
        assert get(middleware, 2) == [status] * 2
        assert api_get(drf_view, 2, user=USER) == [status] * 2
        compat_bodies = [compat_view(rf.get("/mx/", REMOTE_ADDR=IP)).content for _ in range(2)]
        with pytest.raises(redis.ConnectionError):
            Policy("mx-out-direct", rate="2/h").hit(DIRECT_ID)
    # compat follows django-ratelimit: an outage with FAIL_OPEN off limits the request.
    assert compat_bodies == [b"ok" if fail_open else b"limited"] * 2
    meter_after = meter.delta()
    assert meter_after.decisions() == {
        (name, "sliding_log", result): 3,
        ("mx-mw-tight", "sliding_log", result): 2,
        ("mx-mw-wide", "token_bucket", result): 2,
        ("mx-out-drf", "gcra", result): 2,
        (compat_name(compat_view), "fixed_window", result): 2,
        # mx-out-direct: the Python API raises; it decided nothing, counts no result
    }
    assert meter_after.errors() == {
        "django_redislua.ratelimit_sl": 3,  # the single-check script of each decorator call
        "django_redislua.ratelimit": 2,  # the middleware's two checks: one multi-check call
        "django_redislua.ratelimit_gc": 2,
        "django_redislua.ratelimit_fw": 2,  # compat's counter
        "django_redislua.ratelimit_sw": 1,
    }
    # A failed decision took time too: observed, once per policy per call (not compat's).
    assert meter_after.timed() == {name: 3, "mx-mw-tight": 2, "mx-mw-wide": 2, "mx-out-drf": 2,
                                   "mx-out-direct": 1}


@pytest.mark.parametrize("fail_open", [True, False])
def test_an_error_reply_is_a_redis_error(meter: Meter, r: redis.Redis, fail_open: bool) -> None:
    request = rf.get("/mx/", REMOTE_ADDR="192.0.2.1")
    inline_view(request)
    policy = request.ratelimit[0].policy  # type: ignore[attr-defined]
    name = policy.name
    # The script meets WRONGTYPE (a string that is no log reads as no state: test_state_formats)
    r.hset(policy.redis_key(IP), "a", "hash")
    meter.mark()
    with redislua(FAIL_OPEN=fail_open):
        assert get(inline_view, 2) == [200 if fail_open else 503] * 2
    delta = meter.delta()
    result = "failed_open" if fail_open else "unavailable"
    assert delta.decisions() == {(name, "sliding_log", result): 2}
    assert delta.errors() == {"django_redislua.ratelimit_sl": 2}
    assert delta.timed() == {name: 2}


@pytest.mark.parametrize("fail_open", [True, False])
async def test_an_error_reply_is_a_redis_error_on_asyncio(
        meter: Meter, r: redis.Redis, fail_open: bool) -> None:
    # The asyncio server transport's own call (not the protocol's): an error reply that is
    # not a missing script is counted and raised, once per call, as on the sync transport.
    request = rf.get("/mx/", REMOTE_ADDR="192.0.2.1")
    await async_view(request)
    policy = request.ratelimit[0].policy  # type: ignore[attr-defined]
    r.hset(policy.redis_key(IP), "a", "hash")  # the script meets WRONGTYPE
    meter.mark()
    with redislua(FAIL_OPEN=fail_open):
        codes = [(await async_view(rf.get("/mx/", REMOTE_ADDR=IP))).status_code
                 for _ in range(2)]
    assert codes == [200 if fail_open else 503] * 2
    delta = meter.delta()
    result = "failed_open" if fail_open else "unavailable"
    assert delta.decisions() == {(policy.name, "sliding_log", result): 2}
    assert delta.errors() == {"django_redislua.ratelimit_sl": 2}


def test_a_known_denial_survives_an_outage_with_several_checks(meter: Meter) -> None:
    middleware = RateLimitMiddleware(ok)
    with RedisServer() as server, middleware_settings(), redislua(
            CONNECTION=server.url, SOCKET_TIMEOUT=0.2, SOCKET_CONNECT_TIMEOUT=0.2):
        assert get(middleware, 4) == [200, 200, 200, 429]  # the tight policy's denial is known
        server.stop()
        codes = get(middleware, 2)
    # As with one check (tests/test_failopen.py): the outage does not open the door to the
    # identity just refused; the local answers are denials, counted as such.
    assert codes == [429, 429]
    assert meter.delta().results("mx-mw-tight") == {"allowed": 3, "denied": 3}


def test_a_known_denial_survives_an_outage_in_a_policy_throttle(meter: Meter) -> None:
    view = api_view(drf.PolicyThrottle, throttle_policy=["mx-mw-tight", "mx-mw-wide"])
    with RedisServer() as server, middleware_settings(), redislua(
            CONNECTION=server.url, SOCKET_TIMEOUT=0.2, SOCKET_CONNECT_TIMEOUT=0.2):
        assert api_get(view, 4) == [200, 200, 200, 429]
        server.stop()
        codes = api_get(view, 2)
    assert codes == [429, 429]  # refused by the known denial, not admitted by FAIL_OPEN
    delta = meter.delta()
    assert delta.results("mx-mw-tight") == {"allowed": 3, "denied": 3}
    # The wide policy could not be asked during the outage: nothing admitted it either.
    assert delta.results("mx-mw-wide") == {"allowed": 4, "unavailable": 2}


async def test_async_outage(meter: Meter, down: str) -> None:
    with outage(down, True):
        codes = [(await async_view(rf.get("/mx/", REMOTE_ADDR=IP))).status_code
                 for _ in range(2)]
    assert codes == [200, 200]
    delta = meter.delta()
    assert delta.decisions() == {("mx-async", "sliding_log", "failed_open"): 2}
    assert delta.errors() == {"django_redislua.ratelimit_sl": 2}
    assert delta.timed() == {"mx-async": 2}


# -- locks ----------------------------------------------------------------------------------------

def test_lock_acquired_and_timeouts(meter: Meter) -> None:
    holder = Lock(LOCK_NAME, timeout=5)
    assert holder.acquire()
    other = Lock(LOCK_NAME, timeout=5)
    assert not other.acquire(blocking=False)  # a non-blocking try: timeout, ~0 s
    started = time.monotonic()
    assert not other.acquire(blocking_timeout=0.1)
    assert time.monotonic() - started >= 0.1
    with pytest.raises(LockNotAcquired), Lock(LOCK_NAME, timeout=5, blocking_timeout=0.05):
        pass
    holder.release()
    with other:
        pass
    delta = meter.delta()
    assert delta.acquired() == {"acquired": 2, "timeout": 3}
    assert delta.waits() == 5
    assert delta.wait_seconds() >= 0.15
    assert delta.lost() == 0
    assert delta.decisions() == {}


async def test_async_lock_acquired_and_timeout(meter: Meter) -> None:
    holder = Lock(LOCK_NAME, timeout=5)
    assert await holder.aacquire()
    assert not await Lock(LOCK_NAME, timeout=5).aacquire(blocking_timeout=0.05)
    await holder.arelease()
    async with Lock(LOCK_NAME, timeout=5):
        pass
    delta = meter.delta()
    assert delta.acquired() == {"acquired": 2, "timeout": 1}
    assert delta.waits() == 3


def _join_withdrawals() -> None:
    for thread in threading.enumerate():
        if thread.name.startswith("redislua-withdraw:"):
            thread.join(5)


def test_lock_unavailable(meter: Meter, down: str) -> None:
    with outage(down, True):
        with pytest.raises(LockUnavailable):
            Lock(LOCK_NAME, timeout=5).acquire()
        with pytest.raises(LockUnavailable):
            Lock(LOCK_NAME, timeout=5).acquire(blocking=False)
        _join_withdrawals()
    delta = meter.delta()
    assert delta.acquired() == {"unavailable": 2}
    assert delta.waits() == 0  # nothing was waited for
    assert delta.errors() == {"django_redislua.lock_acquire": 2,
                              "django_redislua.lock_withdraw": 2}  # the clean-up failed too


async def test_async_lock_unavailable(meter: Meter, down: str) -> None:
    with outage(down, True):
        with pytest.raises(LockUnavailable):
            await Lock(LOCK_NAME, timeout=5).aacquire()
        await asyncio.sleep(0.05)  # the clean-up task (it fails too)
    delta = meter.delta()
    assert delta.acquired() == {"unavailable": 1}
    assert delta.waits() == 0
    assert delta.errors().get("django_redislua.lock_acquire") == 1


def test_replicated_lock_outage_counts_the_redis_error(meter: Meter, down: str) -> None:
    with outage(down, True):
        with pytest.raises(LockUnavailable):
            Lock(LOCK_NAME, timeout=5, replicas=1).acquire(blocking=False)
        _join_withdrawals()
    delta = meter.delta()
    assert delta.acquired() == {"unavailable": 1}
    assert delta.errors().get("django_redislua.lock_acquire") == 1


def test_unreplicated_lock_is_unavailable(meter: Meter) -> None:
    # No replica confirms within replica_timeout: acquired, released again, LockUnavailable.
    with pytest.raises(LockUnavailable):
        Lock(LOCK_NAME, timeout=5, replicas=1, replica_timeout=0.05).acquire()
    delta = meter.delta()
    assert delta.acquired() == {"unavailable": 1}
    assert delta.lost() == 0


def test_lease_that_ran_out_is_lost_once(meter: Meter) -> None:
    lock = Lock(LOCK_NAME, timeout=0.2)
    assert lock.acquire()
    time.sleep(0.3)
    assert lock.lost
    with pytest.raises(LeaseLost):
        lock.release()
    with pytest.raises(LockNotOwned) as second:
        lock.release()
    assert not isinstance(second.value, LeaseLost)
    assert meter.delta().lost() == 1

    # Found by extend first, then by release: still one lease lost.
    meter.mark()
    assert lock.acquire()
    time.sleep(0.3)
    with pytest.raises(LeaseLost):
        lock.extend(1)
    with pytest.raises(LeaseLost):
        lock.release()
    assert meter.delta().lost() == 1

    # Taken by another owner meanwhile; the body's end (with) finds it.
    meter.mark()
    thief = Lock(LOCK_NAME, timeout=5)
    with pytest.raises(LeaseLost), Lock(LOCK_NAME, timeout=0.2):
        time.sleep(0.3)
        assert thief.acquire(blocking=False)
    thief.release()
    delta = meter.delta()
    assert delta.lost() == 1
    assert delta.acquired() == {"acquired": 2}


def test_renewer_finding_the_lease_taken_counts_once(meter: Meter, r: redis.Redis) -> None:
    noticed = threading.Event()
    lock = Lock(LOCK_NAME, timeout=0.3, auto_renew=True, on_lost=lambda _lock: noticed.set())
    assert lock.acquire()
    r.delete(lock.keys.base)  # another client takes the lease away
    assert noticed.wait(2)
    assert meter.delta().lost() == 1
    with pytest.raises(LeaseLost):
        lock.release()
    with pytest.raises(LockNotOwned):
        lock.release()
    assert meter.delta().lost() == 1


def test_lease_that_ran_out_unrenewed_while_redis_was_down(meter: Meter) -> None:
    noticed = threading.Event()
    with RedisServer() as server, redislua(CONNECTION=server.url, SOCKET_TIMEOUT=0.2,
                                           SOCKET_CONNECT_TIMEOUT=0.2):
        lock = Lock(LOCK_NAME, timeout=0.3, auto_renew=True,
                    on_lost=lambda _lock: noticed.set())
        assert lock.acquire()
        server.stop()  # renewals fail, with back-off, until the lease has run out
        assert noticed.wait(3)
        with pytest.raises(LockUnavailable):
            lock.release()
    delta = meter.delta()
    assert delta.lost() == 1  # the renewer's; the failed release adds none
    assert delta.acquired() == {"acquired": 1}
    errors = delta.errors()
    assert errors.pop("django_redislua.lock_extend") >= 1
    assert errors == {"django_redislua.lock_release": 1}


def lost_total() -> float:
    return REGISTRY.get_sample_value("redislua_lock_lost_total") or 0.0


def wait_for_lost(before: float, timeout: float = 3.0) -> None:
    """Until a renewer (a thread) has counted a lost lease."""
    deadline = time.monotonic() + timeout
    while lost_total() == before and time.monotonic() < deadline:
        time.sleep(0.01)


def test_run_once_lease_lost_counts_once(meter: Meter, r: redis.Redis) -> None:
    @run_once("mx-once-SECRET", timeout=0.3)
    def handler() -> str:
        before = lost_total()
        r.delete("rl:once:{mx-once-SECRET}")  # the run's lease vanishes mid-run
        wait_for_lost(before)  # the renewer notices (it tries every 0.1 s)
        return "done"

    assert handler() == "done"  # the finish found the record gone, no other run: kept
    assert meter.delta().lost() == 1


def test_run_once_lease_lost_found_by_the_finish_counts(meter: Meter, r: redis.Redis) -> None:
    @run_once("mx-once-SECRET")  # a 10 min lease: the renewer does not try before the end
    def handler() -> str:
        r.delete("rl:once:{mx-once-SECRET}")  # as if the lease ran out during a long pause
        return "done"

    assert handler() == "done"
    # "a release found the lease gone": as for a Lock, whose release finds it gone.
    assert meter.delta().lost() == 1


def test_single_flight_build_lease_lost_counts_once(meter: Meter, r: redis.Redis) -> None:
    def build() -> str:
        before = lost_total()
        r.delete("rl:flight:{mx-flight-SECRET}:building")  # the build lease vanishes
        wait_for_lost(before)  # the renewer notices (it tries every 0.1 s)
        return "value"

    assert single_flight("mx-flight-SECRET", build, lock_timeout=0.3) == "value"
    assert meter.delta().lost() == 1  # the renewer's count; the finish (reply 0) adds none

    meter.mark()  # the finish alone finds it (a 10 s lease: the renewer does not try)
    assert single_flight("mx-flight-SECRET-2", lambda: r.delete(
        "rl:flight:{mx-flight-SECRET-2}:building"), lock_timeout=10) == 1
    assert meter.delta().lost() == 1


async def test_async_lease_that_ran_out_is_lost_once(meter: Meter) -> None:
    lock = Lock(LOCK_NAME, timeout=0.2)
    assert await lock.aacquire()
    await asyncio.sleep(0.3)
    with pytest.raises(LeaseLost):
        await lock.arelease()
    with pytest.raises(LockNotOwned):
        await lock.arelease()
    delta = meter.delta()
    assert delta.lost() == 1
    assert delta.acquired() == {"acquired": 1}


# -- no identity in any label ---------------------------------------------------------------------

def test_no_label_ever_holds_an_identity(meter: Meter, otel_reader: InMemoryMetricReader,
                                         down: str) -> None:
    """Everything above once more, with every identity a request or a lock can carry."""
    get(inline_view, 4)
    get(inline_view, 2, REMOTE_ADDR=IP6)
    get(ratelimit(rate="1/h", key="header:x-api-key", group="mx-scan")(ok), 2,
        HTTP_X_API_KEY=API_KEY)
    by_user = ratelimit(rate="1/h", key="user", group="mx-scan-user")(ok)
    for _ in range(2):
        request = rf.get("/mx/", REMOTE_ADDR=IP)
        request.user = USER
        by_user(request)
    api_get(api_view(), 2, user=USER)
    Policy("mx-scan-direct", rate="1/h").hit(DIRECT_ID)
    compat_view(rf.get("/mx/", REMOTE_ADDR=IP))
    holder = Lock(LOCK_NAME, timeout=5)
    holder.acquire()
    Lock(LOCK_NAME, timeout=5).acquire(blocking=False)
    # A job limited per identity, and one whose singleton is the lock held: the job's name is
    # its label, never the identity it is limited by, nor its lock's name.
    job = JobGate("mx-sync", policies=[Policy("mx-job", rate="1/h")], key=DIRECT_ID)
    assert [job.admit().status for _ in range(2)] == ["run", "limited"]
    assert JobGate("mx-nightly", singleton=LOCK_NAME).admit().status == "skipped"
    holder.release()
    short = Lock(LOCK_NAME, timeout=0.05)
    short.acquire()
    time.sleep(0.1)
    with pytest.raises(LeaseLost):
        short.release()
    with outage(down, True):
        get(inline_view, 1)
        with pytest.raises(LockUnavailable):
            Lock(LOCK_NAME, timeout=5).acquire(blocking=False)
        _join_withdrawals()
    assert not meter.delta().nothing()

    text = prom_text()
    lines = [line for line in text.splitlines() if "redislua_" in line]
    assert lines
    for line in lines:
        assert not any(mark in line for mark in IDENTITY_MARKS), line
    families = {f.name: f for f in text_string_to_metric_families(text)
                if f.name.startswith("redislua_")}
    # (the text format's parser reads each ``_created`` series as a family of its own)
    assert {name.removesuffix("_created") for name in families} == {
        "redislua_decisions", "redislua_decision_seconds", "redislua_redis_errors",
        "redislua_lock_acquired", "redislua_lock_wait_seconds", "redislua_lock_lost",
        "redislua_jobs"}
    for family in families.values():
        for sample in family.samples:
            name = sample.name.removesuffix("_created")
            if name == sample.name:
                assert set(sample.labels) == PROM_LABELS[name], sample
            else:  # a _created series carries its counter's (or histogram's) labels
                expected = PROM_LABELS.get(name + "_total", PROM_LABELS.get(name + "_count"))
                assert set(sample.labels) == expected, sample
            for value in sample.labels.values():
                assert not any(mark in value for mark in IDENTITY_MARKS), sample
            if "result" in sample.labels:
                allowed = (metrics.DECISION_RESULTS if "policy" in sample.labels
                           else metrics.LOCK_RESULTS)
                assert sample.labels["result"] in allowed, sample
            if "algorithm" in sample.labels:
                assert sample.labels["algorithm"] in ALGORITHMS, sample
            if "outcome" in sample.labels:
                assert sample.labels["outcome"] in (RAN, RATE_LIMITED, SKIPPED), sample
            if "operation" in sample.labels:
                assert sample.labels["operation"].startswith("django_redislua."), sample

    points = otel_points(otel_reader)
    assert {name for name, _attrs in points} == set(OTEL_NAMES)
    for (name, attributes), _point in points.items():
        assert {k for k, _v in attributes} == OTEL_NAMES[name]
        for _key, value in attributes:
            assert not any(mark in str(value) for mark in IDENTITY_MARKS), (name, attributes)


def test_each_job_call_is_counted_by_its_name_and_outcome(r: Any) -> None:
    def count(outcome: str) -> float:
        return REGISTRY.get_sample_value(
            "redislua_jobs_total", {"job": "mx-report", "outcome": outcome}) or 0.0

    before = {outcome: count(outcome) for outcome in (RAN, RATE_LIMITED, SKIPPED)}
    gate = JobGate("mx-report", policies=[Policy("mx-report", rate="2/h")], singleton=True)
    first = gate.admit()
    assert gate.admit().status == "skipped"  # the first holds the singleton
    gate.done(first)
    gate.done(gate.admit())
    assert gate.admit().status == "limited"
    assert {outcome: count(outcome) - before[outcome] for outcome in before} == {
        RAN: 2, RATE_LIMITED: 1, SKIPPED: 1}


# -- REDISLUA["METRICS"] --------------------------------------------------------------------------

def traffic() -> None:
    """One decision, one Redis error, one lock acquisition (with its wait), one lost lease, one
    job's call."""
    Policy("mx-setting", rate="5/h", algorithm="sliding_log").hit(DIRECT_ID)
    JobGate("mx-setting").admit()
    lock = Lock(LOCK_NAME, timeout=0.05)
    assert lock.acquire()
    time.sleep(0.1)
    with pytest.raises(LeaseLost):
        lock.release()
    with redislua(CONNECTION=f"redis://127.0.0.1:{free_port()}/0"), pytest.raises(
            redis.ConnectionError):
        Policy("mx-setting", rate="5/h", algorithm="sliding_log").hit(DIRECT_ID)


def sinks_moved(delta: Delta) -> tuple[bool, bool]:
    return bool(delta._moved_prom()), bool(delta._moved_otel())


def test_metrics_off_records_nothing(meter: Meter) -> None:
    with redislua(METRICS=[]):
        assert metrics.sinks() == ()
        traffic()
        get(inline_view, 2)
    assert meter.delta().nothing()


@pytest.mark.parametrize(("setting", "expected"), [
    (["prometheus"], (True, False)),
    (("opentelemetry",), (False, True)),
    (["prometheus", "opentelemetry"], (True, True)),
    ("auto", (True, True)),
])
def test_metrics_setting_picks_the_sinks(meter: Meter, setting: Any,
                                         expected: tuple[bool, bool]) -> None:
    with redislua(METRICS=setting):
        traffic()
    delta = meter.delta()
    assert sinks_moved(delta) == expected
    prom_moved = {k[0] for k in delta._moved_prom()}
    otel_moved = {k[0] for k in delta._moved_otel()}
    if expected[0]:
        assert prom_moved == {"redislua_decisions_total", "redislua_decision_seconds_bucket",
                              "redislua_decision_seconds_count", "redislua_decision_seconds_sum",
                              "redislua_redis_errors_total", "redislua_lock_acquired_total",
                              "redislua_lock_wait_seconds_bucket",
                              "redislua_lock_wait_seconds_count",
                              "redislua_lock_wait_seconds_sum", "redislua_lock_lost_total",
                                  "redislua_jobs_total"}
    if expected[1]:
        assert otel_moved == set(OTEL_NAMES)


def test_the_setting_is_read_again_when_it_changes(meter: Meter) -> None:
    policy = Policy("mx-toggle", rate="10/h", algorithm="sliding_log")
    with redislua(METRICS=[]):
        policy.hit(DIRECT_ID)
        with redislua(METRICS=["prometheus"]):
            policy.hit(DIRECT_ID)
        policy.hit(DIRECT_ID)
    policy.hit(DIRECT_ID)  # back to the test settings: "auto"
    delta = meter.delta()
    assert delta._prom(DECISIONS[0], ("policy", "algorithm", "result")) == {
        ("mx-toggle", "sliding_log", "allowed"): 2}
    assert delta._otel(DECISIONS[1], ("policy", "algorithm", "result")) == {
        ("mx-toggle", "sliding_log", "allowed"): 1}


def test_auto_skips_a_backend_that_is_not_installed(meter: Meter,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(metric_backends.MODULES, metrics.OPENTELEMETRY,
                        "redislua_absent_pkg.metrics")
    assert not metrics.installed(metrics.OPENTELEMETRY)
    with redislua(METRICS="auto"):
        assert metrics.wanted("auto") == ["prometheus"]
        Policy("mx-auto", rate="5/h").hit(DIRECT_ID)
    assert sinks_moved(meter.delta()) == (True, False)

    monkeypatch.setattr(metrics, "installed", lambda backend: False)
    meter.mark()
    with redislua(METRICS="auto"):
        assert metrics.sinks() == ()
        Policy("mx-auto", rate="5/h").hit(DIRECT_ID)
    assert meter.delta().nothing()


def test_a_second_prometheus_sink_reuses_the_registered_instruments(meter: Meter) -> None:
    """The module imported twice (an autoreloader): no duplicate-registration error, and the
    second sink's counts land in the same series."""
    again = metrics._Prometheus()
    again.decision("mx-again", "gcra", "allowed")
    again.decision_seconds("mx-again", 0.001)
    again.decided("mx-again", "gcra", "denied", 0.001)  # the engine's hot path
    again.redis_error("django_redislua.ratelimit_gc")
    again.lock_acquired("acquired")
    again.lock_wait(0.002)
    again.lock_lost()
    delta = meter.delta()
    assert delta._prom(DECISIONS[0], ("policy", "algorithm", "result")) == {
        ("mx-again", "gcra", "allowed"): 1, ("mx-again", "gcra", "denied"): 1}
    assert delta._prom(SECONDS[0], ("policy",)) == {("mx-again",): 2}
    assert delta._prom(ERRORS[0], ("operation",)) == {("django_redislua.ratelimit_gc",): 1}
    assert delta._prom(ACQUIRED[0], ("result",)) == {("acquired",): 1}
    assert delta._prom(WAIT[0], ()) == {(): 1}
    assert delta._prom(LOST[0], ()) == {(): 1}
    assert not delta._moved_otel()


def metrics_ids(value: Any) -> list[str]:
    with override_settings(REDISLUA={"CONNECTION": "redis://127.0.0.1:6379/0", "METRICS": value}):
        return [m.id for m in check_settings()]


@pytest.mark.parametrize("value", ["yes", ["statsd"], ["prometheus", "prometheus"], "prometheus",
                                   None, True, {"prometheus"}, [["prometheus"]],
                                   ["Prometheus"]])
def test_e025_invalid_metrics_setting(value: Any) -> None:
    assert metrics_ids(value) == ["redislua.E025"]


@pytest.mark.parametrize("value", ["auto", [], ["prometheus"], ("opentelemetry",),
                                   ["opentelemetry", "prometheus"]])
def test_valid_metrics_settings_have_no_messages(value: Any) -> None:
    assert metrics_ids(value) == []


def test_e025_from_run_checks_and_for_a_package_not_installed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with redislua(METRICS=["prometheus", "prometheus"]):
        assert "redislua.E025" in [m.id for m in run_checks()]
    monkeypatch.setitem(metric_backends.MODULES, metrics.OPENTELEMETRY,
                        "redislua_absent_pkg.metrics")
    with redislua(METRICS=["prometheus", "opentelemetry"]):
        messages = [m for m in run_checks() if m.id == "redislua.E025"]
    assert len(messages) == 1
    assert "opentelemetry" in messages[0].msg and "otel" in (messages[0].hint or "")
