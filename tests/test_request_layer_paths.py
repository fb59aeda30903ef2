"""One request layer: the decorator, the middleware, the DRF throttles and compat decide through
``request_layer.deciding``, and nowhere else.

Before, ``drf._decide`` and ``compat.core.usage`` each held their own copy of deciding, of the
failure and recovery reporting, of the shadow recording and of the signal; the copies drifted
(a DRF ``block=False`` policy never set ``request.limited``; a denial known without Redis was
signalled by DRF but not by the decorator). These tests hold the layers to one behaviour: the
same records, signals and metrics for the same policies and requests, one recovery line per
outage whichever layer sees Redis answer again, and no layer but the request layer that asks
the engine, signals, or reports.
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from django_redislua import drf, metrics
from django_redislua.compat import core
from django_redislua.decorators import ratelimit
from django_redislua.signals import rate_limited
from django_redislua.testing import RedisServer, free_port

PACKAGE = Path(__file__).resolve().parent.parent / "django_redislua"
rf = RequestFactory()
api = APIRequestFactory()
RECOVERED = "Rate limiting decides again"
OUTAGE = "Redis is unreachable for rate limiting"


def redislua(**changes: Any) -> override_settings:
    return override_settings(REDISLUA={**django_settings.REDISLUA, **changes})


def with_policies(**policies: dict[str, Any]) -> override_settings:
    return redislua(POLICIES={**django_settings.REDISLUA["POLICIES"], **policies})


def ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def api_view(throttle: type[Any], **attrs: Any) -> Any:
    class View(APIView):
        throttle_classes = [throttle]
        authentication_classes: list[Any] = []

        def get(self, request: Request) -> Response:
            return Response({"ok": True})

    for name, value in attrs.items():
        setattr(View, name, value)
    return View.as_view()


class Signals:
    """Receives ``rate_limited`` while used as a context manager."""

    def __init__(self) -> None:
        self.received: list[tuple[Any, str, bool, bool]] = []

    def __call__(self, sender: Any, request: Any, decision: Any, **kwargs: Any) -> None:
        self.received.append((sender, decision.policy.name, decision.allowed, decision.shadow))

    def __enter__(self) -> Signals:
        rate_limited.connect(self)
        return self

    def __exit__(self, *exc: object) -> None:
        rate_limited.disconnect(self)


class RecordingSink:
    """A metrics sink that keeps what it is told: (policy, algorithm, result) per decision."""

    def __init__(self) -> None:
        self.decisions: list[tuple[str, str, str]] = []

    def decided(self, policy: str, algorithm: str, result: str, seconds: float) -> None:
        self.decisions.append((policy, algorithm, result))

    def decision(self, policy: str, algorithm: str, result: str) -> None:
        self.decisions.append((policy, algorithm, result))

    def decision_seconds(self, policy: str, seconds: float) -> None:
        pass

    def redis_error(self, operation: str) -> None:
        pass

    def lock_acquired(self, result: str) -> None:
        pass

    def lock_wait(self, seconds: float) -> None:
        pass

    def lock_lost(self) -> None:
        pass


@pytest.fixture
def sink(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], RecordingSink]]:
    """``sink()`` installs a fresh recording sink (after any settings change: a change makes
    the metrics module choose its sinks again) and returns it."""

    def install() -> RecordingSink:
        recording = RecordingSink()
        monkeypatch.setattr(metrics, "_sinks", (recording,))
        return recording

    yield install


# -- the shape: no second copy --------------------------------------------------------------------

# What only the request layer may use: the engine's deciding, the signal, the failure and
# recovery reporting, the shadow records.
LAYER_ONLY = {"evaluate", "aevaluate", "evaluation", "rate_limited", "report_recovery",
              "report_outage", "report_failure", "record_shadow", "_failing"}
CALLERS = ("decorators.py", "middleware.py", "drf.py", "compat")


def used_names(path: Path) -> set[str]:
    """Every name ``path`` imports, reads or reaches as an attribute."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom | ast.Import):
            found.update(alias.name.rpartition(".")[2] for alias in node.names)
        elif isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
    return found


def caller_modules() -> list[Path]:
    paths: list[Path] = []
    for name in CALLERS:
        target = PACKAGE / name
        paths.extend(sorted(target.glob("*.py")) if target.is_dir() else [target])
    return paths


def test_only_the_request_layer_decides_signals_and_reports() -> None:
    """The decorator, the middleware, the DRF throttles and compat call the request layer's
    ``deciding`` (or its drivers: ``decide``, ``guarded``, and the lean ``guard`` and
    ``aguard``); none asks the engine, sends the signal or reports a failure itself."""
    paths = caller_modules()
    assert len(paths) >= 6
    copies = {str(p.relative_to(PACKAGE)): sorted(used_names(p) & LAYER_ONLY) for p in paths}
    assert {path: names for path, names in copies.items() if names} == {}
    users = {str(p.relative_to(PACKAGE)) for p in paths
             if {"deciding", "decide", "guarded", "guard", "aguard"} & used_names(p)}
    assert {"decorators.py", "middleware.py", "drf.py", "compat/core.py"} <= users


# -- the same records, signals and metrics --------------------------------------------------------

PARITY_POLICIES = {
    "pp-gate": {"algorithm": "sliding_log", "rate": "2/m", "key": "ip"},
    "pp-shadow": {"algorithm": "sliding_log", "rate": "1/m", "key": "ip", "mode": "shadow"},
    "pp-soft": {"algorithm": "sliding_log", "rate": "1/m", "key": "ip", "block": False},
}


def _seen(request: Any) -> dict[str, Any]:
    def listed(decisions: Any) -> list[tuple[str, bool, int]]:
        return sorted((d.policy.name, d.allowed, d.remaining) for d in decisions or ())

    return {"ratelimit": listed(getattr(request, "ratelimit", None)),
            "shadow": listed(getattr(request, "ratelimit_shadow", None)),
            "limited": getattr(request, "limited", None)}


def test_drf_and_the_decorator_record_signal_and_count_alike(
        sink: Callable[[], RecordingSink]) -> None:
    """One enforced, one shadow and one block=False policy, three requests each through
    ``@ratelimit`` and through ``PolicyThrottle``: the same statuses, ``request.ratelimit``,
    ``request.ratelimit_shadow``, ``request.limited``, signals and metrics."""
    names = list(PARITY_POLICIES)
    with with_policies(**PARITY_POLICIES):
        decorated = ok
        for name in reversed(names):
            decorated = ratelimit(name)(decorated)
        drf_requests: list[Any] = []

        class Capturing(drf.PolicyThrottle):
            def allow_request(self, request: Any, view: Any) -> bool:
                drf_requests.append(request)
                return super().allow_request(request, view)

        throttled = api_view(Capturing, throttle_policy=names)
        runs: dict[str, list[Any]] = {}
        for layer in ("decorator", "drf"):
            recording = sink()
            with Signals() as signals:
                steps = []
                for _ in range(3):
                    if layer == "decorator":
                        request = rf.get("/", REMOTE_ADDR="198.51.100.1")
                        status = decorated(request).status_code
                    else:
                        status = throttled(api.get("/", REMOTE_ADDR="198.51.100.2")).status_code
                        request = drf_requests[-1]
                    steps.append((status, _seen(request)))
            runs[layer] = [steps, sorted(s[1:] for s in signals.received),
                           sorted(recording.decisions), {s[0] for s in signals.received}]
    decorator, api_run = runs["decorator"], runs["drf"]
    assert [status for status, _seen_ in decorator[0]] == [200, 200, 429]
    assert decorator[0][1][1]["limited"] is True  # the block=False denial marks the request
    assert decorator[:3] == api_run[:3]
    assert decorator[3] == {ratelimit} and api_run[3] == {Capturing}


# -- a denial known without Redis ------------------------------------------------------------------

KNOWN_POLICIES = {
    "pk-tight": {"algorithm": "sliding_log", "rate": "1/m", "key": "ip"},
    "pk-wide": {"algorithm": "sliding_log", "rate": "100/m", "key": "ip"},
}


@pytest.mark.parametrize("layer", ["decorator", "drf"])
def test_a_denial_known_without_redis_is_signalled_when_redis_fails(layer: str) -> None:
    """Redis fails for a request a rule already refused without it (the local denial cache):
    429, and that denial is signalled like any other, by every layer."""
    if layer == "decorator":
        view: Any = ratelimit("pk-tight")(ratelimit("pk-wide")(ok))

        def get() -> int:
            return int(view(rf.get("/", REMOTE_ADDR="198.51.100.3")).status_code)
    else:
        throttled = api_view(drf.PolicyThrottle, throttle_policy=["pk-tight", "pk-wide"])

        def get() -> int:
            return int(throttled(api.get("/", REMOTE_ADDR="198.51.100.3")).status_code)

    with RedisServer() as server, with_policies(**KNOWN_POLICIES), redislua(
            CONNECTION=server.url, SOCKET_TIMEOUT=0.3, SOCKET_CONNECT_TIMEOUT=0.3):
        assert [get(), get()] == [200, 429]  # the tight policy's denial is now known here
        server.stop()
        with Signals() as signals:
            assert get() == 429  # refused by the known denial, not admitted by FAIL_OPEN
    assert [s[1:] for s in signals.received] == [("pk-tight", False, False)]


# -- one recovery line per outage ------------------------------------------------------------------

def _asker(layer: str) -> Callable[[], int]:
    """One request through ``layer`` (each on its own limit, never reached); its status."""
    if layer == "decorator":
        view: Any = ratelimit(rate="1000/m", key="ip")(ok)
        return lambda: int(view(rf.get("/", REMOTE_ADDR="198.51.100.4")).status_code)
    if layer in ("drf-simple", "drf-policy"):
        throttle: type[Any] = drf.UserRateThrottle if layer == "drf-simple" else drf.PolicyThrottle
        throttled = api_view(throttle, throttle_policy="api")
        return lambda: int(throttled(api.get("/", REMOTE_ADDR="198.51.100.4")).status_code)

    def compat() -> int:
        request = rf.get("/", REMOTE_ADDR="198.51.100.4")
        return 429 if core.is_ratelimited(request, group="recovery", key="ip", rate="1000/m",
                                           increment=True) else 200

    return compat


@pytest.mark.parametrize("layer", ["decorator", "drf-simple", "drf-policy", "compat"])
def test_an_outage_and_its_end_are_logged_once_by_every_layer(
        layer: str, caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    ask = _asker(layer)
    with RedisServer(workdir=str(tmp_path)) as server, redislua(
            CONNECTION=server.url, FAIL_OPEN=True, SOCKET_TIMEOUT=0.3,
            SOCKET_CONNECT_TIMEOUT=0.3), caplog.at_level(logging.WARNING,
                                                          logger="django_redislua"):
        assert ask() == 200
        server.stop()
        assert [ask(), ask()] == [200, 200]  # failed open
        server.start()
        assert [ask(), ask()] == [200, 200]
    lines = [r.getMessage() for r in caplog.records if r.name == "django_redislua"]
    assert len(lines) == 2, lines
    assert lines[0].startswith(OUTAGE)
    assert lines[1] == (f"{RECOVERED}: Redis answered after 2 failed decisions; limits apply "
                        "again.")


def test_an_outage_seen_by_one_layer_ends_once_whichever_layer_decides_next(
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """The decorator meets the outage; compat and DRF meet its end: one recovery line."""
    decorator, compat, throttle = _asker("decorator"), _asker("compat"), _asker("drf-simple")
    with RedisServer(workdir=str(tmp_path)) as server, redislua(
            CONNECTION=server.url, FAIL_OPEN=True, SOCKET_TIMEOUT=0.3,
            SOCKET_CONNECT_TIMEOUT=0.3), caplog.at_level(logging.WARNING,
                                                          logger="django_redislua"):
        server.stop()
        assert decorator() == 200
        server.start()
        assert [compat(), throttle(), decorator()] == [200, 200, 200]
    lines = [r.getMessage() for r in caplog.records if r.name == "django_redislua"]
    assert len(lines) == 2, lines
    assert lines[0].startswith(OUTAGE)
    assert lines[1] == (f"{RECOVERED}: Redis answered after 1 failed decisions; limits apply "
                        "again.")


@pytest.mark.parametrize("layer", ["decorator", "drf-broken"])
def test_nothing_asked_is_no_recovery(layer: str, caplog: pytest.LogCaptureFixture) -> None:
    """During an outage, a request whose rules ask Redis nothing (a POST-only rule on a GET, a
    throttle that cannot be used) says nothing of a recovery: Redis did not answer."""
    failing = ratelimit(rate="1000/m", key="ip")(ok)
    if layer == "decorator":
        view: Any = ratelimit(rate="1000/m", key="ip", methods=["POST"])(ok)
    else:
        class Unrated(drf.SimpleRateThrottle):
            scope = "no-such-scope"  # no rate: throttle.error, admitted with FAIL_OPEN

            def get_cache_key(self, request: Any, view: Any) -> str | None:
                return "unused"

        view = api_view(Unrated)

    def quiet() -> int:
        request = (rf if layer == "decorator" else api).get("/", REMOTE_ADDR="198.51.100.5")
        return int(view(request).status_code)

    with redislua(CONNECTION=f"redis://127.0.0.1:{free_port()}/0", FAIL_OPEN=True), \
            caplog.at_level(logging.WARNING, logger="django_redislua"):
        assert failing(rf.get("/", REMOTE_ADDR="198.51.100.5")).status_code == 200
        assert [quiet(), quiet()] == [200, 200]
    lines = [r.getMessage() for r in caplog.records
             if r.name == "django_redislua" and r.levelno == logging.WARNING]
    assert [line for line in lines if line.startswith(RECOVERED)] == []
    assert lines and lines[0].startswith(OUTAGE)


# -- compat's own terms ----------------------------------------------------------------------------

def test_compat_records_nothing_on_the_request() -> None:
    """django-ratelimit's is_ratelimited sets no attribute; the layer records nothing for it."""
    request = rf.get("/", REMOTE_ADDR="198.51.100.6")
    assert [core.is_ratelimited(request, group="rec", key="ip", rate="1/m", increment=True)
            for _ in range(2)] == [False, True]
    assert not {"ratelimit", "ratelimit_shadow", "limited"} & set(vars(request))


def test_compat_signals_and_counts_what_it_reads(sink: Callable[[], RecordingSink]) -> None:
    """A compat denial is django-ratelimit's (count > limit): signalled from get_usage with the
    Decision in the limit's terms, counted under the counting policy; a look is neither."""
    recording = sink()
    request = rf.get("/", REMOTE_ADDR="198.51.100.7")
    args = {"group": "reads", "key": "ip", "rate": "1/m"}
    with Signals() as signals:
        found = [core.get_usage(request, increment=True, **args) for _ in range(2)]
        looked = core.get_usage(request, **args)
    assert [u["should_limit"] for u in found if u] == [False, True]
    assert looked is not None and looked["count"] == 2 and looked["should_limit"]
    [(sender, name, allowed, _shadow)] = signals.received
    assert sender is core.get_usage and not allowed
    assert name == found[1]["decision"].policy.name  # type: ignore[index]
    counter = core._policies("reads", 1, 60, "")[0]
    assert recording.decisions == [(counter.name, "fixed_window", "allowed"),
                                   (counter.name, "fixed_window", "denied")]


async def test_compat_async_signals_from_the_one_path() -> None:
    request = rf.get("/", REMOTE_ADDR="198.51.100.8")
    with Signals() as signals:
        assert [await core.ais_ratelimited(request, group="a", key="ip", rate="1/m",
                                           increment=True) for _ in range(2)] == [False, True]
    assert [(s[0], s[2]) for s in signals.received] == [(core.get_usage, False)]
