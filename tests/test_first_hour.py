"""A new user's first-hour mistakes: each is named where it is made, with the fix, and none
reaches a request as a 500.

- ``@ratelimit`` applied bare, or with django-ratelimit's ``method=``: refused when the view
  module is imported (a TypeError saying what to write instead).
- ``django_redislua`` missing from INSTALLED_APPS: no system check can run (the app registers
  them); the first use says it (ImproperlyConfigured naming INSTALLED_APPS), a lock raises
  LockUnavailable carrying that message, and a limited view follows FAIL_OPEN.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings

from django_redislua.decorators import ratelimit
from django_redislua.locks import Lock, LockUnavailable
from django_redislua.scripts import ScriptError, get_script

pytestmark = pytest.mark.django_db


def test_a_bare_ratelimit_is_refused_with_the_fix() -> None:
    with pytest.raises(TypeError, match=r"needs its arguments.*@ratelimit\(\"policy-name\"\)"):

        @ratelimit  # type: ignore[arg-type]
        def view(request: object) -> None: ...


def test_a_bare_ratelimit_on_a_class_is_refused_too() -> None:
    from django.views import View

    with pytest.raises(TypeError, match="needs its arguments"):

        @ratelimit  # type: ignore[arg-type]
        class Page(View): ...


@pytest.mark.parametrize(("given", "hint"), [
    ({"method": "POST"}, r"method='POST' is django-ratelimit's spelling: write methods=\['POST'\]"),
    ({"method": ["GET", "POST"]}, r"write methods=\['GET', 'POST'\]"),
    ({"ratelimit_key": "ip"}, "ratelimit_key= is called key= here"),
    ({"keyfunc": "ip"}, "keyfunc= is not an argument of ratelimit()"),
])
def test_an_argument_it_does_not_take_names_the_right_one(given: dict[str, object],
                                                           hint: str) -> None:
    with pytest.raises(TypeError, match=hint) as failure:
        ratelimit(rate="5/m", **given)  # type: ignore[arg-type]
    assert "Its arguments: policy, rate, key" in str(failure.value)


def without_the_app() -> override_settings:
    return override_settings(
        INSTALLED_APPS=[app for app in settings.INSTALLED_APPS if app != "django_redislua"])


def test_a_missing_app_is_named_at_first_use() -> None:
    with without_the_app():
        with pytest.raises(ImproperlyConfigured,
                           match=r'not in INSTALLED_APPS.*Add "django_redislua" to INSTALLED_APPS'):
            get_script("django_redislua.lock_acquire")
        with pytest.raises(LockUnavailable, match="INSTALLED_APPS"):
            Lock("first-hour", timeout=5).acquire()
        # Nothing was sent, so the acquire's give-back (a thread) sends nothing and ends at
        # once: it used to try again for the lease's 5 s and more, into the next tests, and
        # raise there (a ScriptError in a thread, once the registry changed under it).
        for thread in threading.enumerate():
            if thread.name == "redislua-withdraw:first-hour":
                thread.join(5)
                assert not thread.is_alive()
    assert Lock("first-hour", timeout=5).acquire()  # installed again: everything works


@pytest.mark.unit
def test_a_background_give_back_that_fails_is_logged_not_raised(
        caplog: pytest.LogCaptureFixture) -> None:
    """A spawned protocol (a give-back, a renewal) has nobody to raise to: its own failure is
    a WARNING with the traceback on the django_redislua logger, never an exception that kills
    its thread (a traceback on stderr only) or sits in a task nobody awaits."""
    from django_redislua import atransport, transport
    from django_redislua.protocol import raising

    with caplog.at_level(logging.WARNING, logger="django_redislua"):
        transport.in_background(raising(ScriptError("gone")), transport.Unbuilt(), "give-back")
        asyncio.run(atransport.in_background(raising(ScriptError("gone")),
                                             atransport.AsyncUnbuilt(), "agive-back"))
    assert [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records] == [
        ("WARNING", "give-back failed; what it was giving back expires by itself", True),
        ("WARNING", "agive-back failed; what it was giving back expires by itself", True)]


@pytest.mark.parametrize("finds", ["all", "library"])
def test_a_discovery_begun_before_the_app_was_removed_is_not_kept(
        finds: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread (a lock's background withdrawal, say) finds the scripts, or builds the
    Functions library from them, while the app is installed; the app is removed before it
    ends: what it found is not kept, so the next use still says the app is missing (this once
    let a test's requests be limited with the app removed)."""
    from django_redislua.scripts import AppNotInstalled, registry

    found_old, clearing, cleared = threading.Event(), threading.Event(), threading.Event()
    discover, clear = registry._discover, registry.clear

    def discover_slowly() -> dict[str, object]:
        found = discover()  # under the apps as they were
        found_old.set()
        # Until the app is removed: the registry heard of it (events, not a poll of the app
        # registry, which raises AppRegistryNotReady while override_settings reloads it).
        assert clearing.wait(5)
        # A clear that did not wait for this discovery would end now, and what this returns
        # would then be kept: given the time to, it is seen below. This one waits for it.
        cleared.wait(0.2)
        return found  # type: ignore[return-value]

    def clear_heard() -> None:
        clearing.set()
        clear()
        cleared.set()

    registry.clear()
    monkeypatch.setattr(registry, "_discover", discover_slowly)
    monkeypatch.setattr(registry, "clear", clear_heard)
    other: list[object] = []
    thread = threading.Thread(target=lambda: other.append(getattr(registry, finds)()))
    thread.start()
    try:
        assert found_old.wait(5)
        with without_the_app():  # clears the registry (setting_changed)
            thread.join(5)
            assert "lock_acquire" in str(other[0])  # its caller used what it found
            monkeypatch.undo()
            with pytest.raises(AppNotInstalled):
                get_script("django_redislua.lock_acquire")
            assert "lock_acquire" not in registry.library()[1]
    finally:
        thread.join(5)
    assert get_script("django_redislua.lock_acquire")  # installed again: found again
    assert "lock_acquire" in registry.library()[1]


@pytest.mark.parametrize(("fail_open", "status"), [(True, 200), (False, 503)])
def test_a_missing_app_follows_fail_open_for_requests(
        fail_open: bool, status: int, caplog: pytest.LogCaptureFixture) -> None:
    with without_the_app(), override_settings(
            REDISLUA={**settings.REDISLUA, "FAIL_OPEN": fail_open}), \
            caplog.at_level(logging.WARNING, logger="django_redislua"):
        statuses = [Client().get("/rl/inline/").status_code for _ in range(5)]
    assert statuses == [status] * 5  # never a 500; the 3/m limit is not applied
    lines = [r.getMessage() for r in caplog.records if r.name == "django_redislua"]
    assert len(lines) == 1, lines  # once, not per request
    assert "Rate limiting is misconfigured" in lines[0]
    assert "Add \"django_redislua\" to INSTALLED_APPS" in lines[0]


def policy_checks(rate: str) -> list[object]:
    from django_redislua.checks import check_settings, check_views

    policies = {**settings.REDISLUA["POLICIES"], "login": {"rate": rate, "key": "ip"}}
    with override_settings(REDISLUA={**settings.REDISLUA, "POLICIES": policies}):
        return [*check_settings(), *check_views()]


def test_a_rate_in_words_is_not_taken_for_a_module_path() -> None:
    found = [m for m in policy_checks("5 per minute") if m.id == "redislua.E006"]  # type: ignore[attr-defined]
    assert len(found) == 1, found  # the policy once, not again for the view that uses it
    message = found[0]
    assert "rate '5 per minute' is not a rate" in message.msg  # type: ignore[attr-defined]
    assert "module path" not in message.msg  # type: ignore[attr-defined]
    assert message.hint.startswith('Write a rate as "5/m"')  # type: ignore[attr-defined]


@pytest.mark.parametrize("rate", ["5/minutes", "5/min", "1000/day", "3/15m", "100/10s"])
def test_the_rate_forms_people_write_are_accepted(rate: str) -> None:
    assert [m for m in policy_checks(rate) if m.id == "redislua.E006"] == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("rate", ["5/x", "tests.nowhere.rate_for", "5 per minute"])
def test_a_broken_policy_used_by_views_is_reported_once(rate: str) -> None:
    assert len([m for m in policy_checks(rate)
                if m.id == "redislua.E006"]) == 1  # type: ignore[attr-defined]


def test_every_check_hint_says_the_fix_before_the_link() -> None:
    from django_redislua.checks import FIXES, check_settings
    from django_redislua.links import check_url

    broken = {"CONNECTION": "mysql://x", "HEADERS": "x", "FAIL_OPEN": "no",
              "TRUSTED_PROXIES": -1, "IPV4_MASK": 99, "KEY_PREFIX": "{x}",
              "MIDDLEWARE_POLICIES": "x", "DENIED_VIEW": "nowhere.view", "SOCKET_TIMEOUT": 0,
              "LOCK_CLAIM_WINDOW": 0, "LEAN_CALLS": "no", "METRICS": "x",
              "POLICIES": {"a": {"rate": "5/x"}, "b": {"algorithm": "x", "rate": "5/m"},
                           "c": {"rate": "5/m", "burst": 2}, "d": {"rate": "5/m", "key": "x:y"},
                           "e": {"algorithm": "concurrency"}, "f": {"rate": "5/m",
                                                                   "methods": [1]},
                           "g": {"rate": "5/m", "mode": "x"}, "h": "x"}}
    with override_settings(REDISLUA=broken):
        found = check_settings()
    assert len({m.id for m in found}) >= 15
    for message in found:
        assert message.hint is not None
        assert not message.hint.startswith("See "), message
        assert message.hint.endswith(f"See {check_url(message.id)}"), message
        if message.id in FIXES:
            assert message.hint.startswith(FIXES[message.id]) or "pip install" in message.hint


def deploy_checks(connection: str) -> list[object]:
    from django.core.checks import run_checks

    with override_settings(REDISLUA={**settings.REDISLUA, "CONNECTION": connection,
                                     "SOCKET_CONNECT_TIMEOUT": 0.3, "SOCKET_TIMEOUT": 0.3}):
        return [m for m in run_checks(include_deployment_checks=True)
                if m.id == "redislua.W005"]  # type: ignore[attr-defined]


def test_check_deploy_says_when_redis_cannot_be_reached() -> None:
    from django_redislua.testing import RedisServer, free_port

    [refused] = deploy_checks(f"redis://127.0.0.1:{free_port()}/0")
    assert "cannot be reached" in refused.msg and "ConnectionError" in refused.msg  # type: ignore[attr-defined]
    assert "every rate limit is off (FAIL_OPEN=True" in refused.msg  # type: ignore[attr-defined]
    assert refused.hint.startswith("Check the address, the password")  # type: ignore[attr-defined]
    with RedisServer(password="s3cret") as server:
        wrong = server.url.replace("s3cret", "wrong")
        [denied] = deploy_checks(wrong)
        assert "AuthenticationError" in denied.msg or "WRONGPASS" in denied.msg  # type: ignore[attr-defined]
        assert "wrong" not in denied.msg  # type: ignore[attr-defined]  # no password echoed
        assert deploy_checks(server.url) == []
    assert deploy_checks(settings.REDISLUA["CONNECTION"]) == []


def test_check_without_deploy_stays_offline() -> None:
    from django.core.checks import run_checks

    from django_redislua.testing import free_port

    with override_settings(REDISLUA={**settings.REDISLUA,
                                     "CONNECTION": f"redis://127.0.0.1:{free_port()}/0"}):
        assert [m for m in run_checks() if m.id.startswith("redislua.")] == []


def test_an_outage_is_logged_once_and_its_end_once(
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    from django_redislua.testing import RedisServer

    with RedisServer(workdir=str(tmp_path)) as server, override_settings(REDISLUA={
            **settings.REDISLUA, "CONNECTION": server.url, "FAIL_OPEN": True,
            "SOCKET_TIMEOUT": 0.3, "SOCKET_CONNECT_TIMEOUT": 0.3}), \
            caplog.at_level(logging.WARNING, logger="django_redislua"):
        web = Client()
        assert web.get("/rl/inline/").has_header("RateLimit")  # decided
        server.stop()
        down = [web.get("/rl/inline/") for _ in range(3)]
        assert [r.status_code for r in down] == [200] * 3
        assert not any(r.has_header("RateLimit") for r in down)  # failed open
        server.start()
        back = [web.get("/rl/inline/") for _ in range(2)]
        assert all(r.has_header("RateLimit") for r in back)
    lines = [r.getMessage() for r in caplog.records if r.name == "django_redislua"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("Redis is unreachable for rate limiting")
    assert lines[1] == ("Rate limiting decides again: Redis answered after 3 failed decisions; "
                        "limits apply again.")
