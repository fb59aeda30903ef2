"""Every configuration mistake a deployment can make: `manage.py check` names it by id, and no
request path raises (gunicorn runs no checks, so a mistake that slips through meets the
FAIL_OPEN guard: the broken rule is skipped and logged, or the request is answered 503; a
rate callable's mistake, which no check can see, is answered 503 or decided at the policy's
fallback_rate)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client, override_settings

from django_redislua.checks import check_settings, check_views
from django_redislua.links import DOCS_URL

pytestmark = pytest.mark.django_db

BROKEN_URLS = override_settings(ROOT_URLCONF="tests.testapp.broken_urls")
ROUTES = [
    "/unknown-policy/", "/bad-inline-rate/", "/bad-inline-algorithm/", "/garbage-rate/",
    "/bad-key/", "/nested/method/", "/one-good-one-broken/", "/drf/scope/", "/drf/policy/",
]


def redislua(**changes: object) -> override_settings:
    from django.conf import settings

    return override_settings(REDISLUA={**settings.REDISLUA, **changes})


def messages() -> dict[str, str]:
    return {m.msg: m.id for m in check_views()}


def test_the_checks_walk_the_urlconf_and_report_each_view_by_id() -> None:
    with BROKEN_URLS:
        found = messages()
    expected = {
        "'unknown-policy/'": ("redislua.E021", "no REDISLUA policy named 'typo'"),
        "'bad-inline-rate/'": ("redislua.E006", "unknown time unit 'x'"),
        "'bad-inline-algorithm/'": ("redislua.E005", "unknown algorithm 'leaky'"),
        "'bad-key/'": ("redislua.E008", "unknown key type 'cookie:x'"),
        "'nested/method/'": ("redislua.E021", "'typo-on-a-method'"),
        "'one-good-one-broken/'": ("redislua.E021", "'typo-stacked'"),
    }
    for route, (check_id, text) in expected.items():
        hits = [m for m, i in found.items() if route in m and text in m and i == check_id]
        assert hits, (route, check_id, text, found)
    drf = [(m, i) for m, i in found.items() if "Throttle on" in m]
    assert ("ScopedRateThrottle on drf/scope/: No default throttle rate set for "
            "'no-such-scope' scope", "redislua.E022") in drf
    assert any(i == "redislua.E021" and "'nope'" in m for m, i in drf), drf
    assert len(found) == 8, found  # the valid views and the garbage-rate callable add nothing


def test_manage_py_check_fails_on_them_with_links_to_the_published_docs() -> None:
    with BROKEN_URLS, pytest.raises(SystemCheckError) as failure:
        call_command("check", stdout=StringIO(), stderr=StringIO())
    text = str(failure.value)
    assert DOCS_URL.startswith("https://")
    for check_id in ("E005", "E006", "E008", "E021", "E022"):
        assert f"redislua.{check_id}" in text
        assert f"{DOCS_URL}checks.html#redislua-{check_id.lower()}" in text
    assert "docs/checks.md" not in text


def test_the_project_urlconf_has_no_mistakes() -> None:
    assert check_views() == []


@pytest.mark.parametrize("route", ROUTES)
def test_no_request_path_raises_fail_open(route: str, caplog: pytest.LogCaptureFixture) -> None:
    client = Client(raise_request_exception=True)
    with BROKEN_URLS, caplog.at_level("ERROR", logger="django_redislua"):
        statuses = [client.get(route).status_code for _ in range(3)]
    errors = [r for r in caplog.records if r.name == "django_redislua"]
    assert len(errors) == 1 and "redislua.E0" in errors[0].getMessage()  # once, not per request
    if route == "/garbage-rate/":
        # A rate callable's mistake is not skipped, even failing open: never silently
        # unlimited (issue 35; tests/test_rate_callables.py tries every layer).
        assert statuses == [503, 503, 503]
        assert "_garbage_rate returned ['not', 'a', 'rate']" in errors[0].getMessage()
        return
    assert statuses == [200, 200, 200]


@pytest.mark.parametrize("route", ROUTES)
def test_no_request_path_raises_fail_closed(route: str) -> None:
    client = Client(raise_request_exception=True)
    with BROKEN_URLS, redislua(FAIL_OPEN=False):
        response = client.get(route)
    assert response.status_code == 503 and response["Retry-After"] == "1"


def test_the_good_rule_beside_a_broken_one_is_still_decided() -> None:
    client = Client(raise_request_exception=True)
    with BROKEN_URLS:
        response = client.get("/one-good-one-broken/")
    assert response.status_code == 200
    assert response["RateLimit-Policy"].startswith('"api"')


def test_one_broken_policy_in_settings_breaks_only_the_views_using_it() -> None:
    client = Client(raise_request_exception=True)
    with BROKEN_URLS, redislua(POLICIES={
        "api": {"rate": "2/m", "key": "ip"}, "typo": {"rate": "20/x"},
    }):
        assert [m.id for m in check_settings()] == ["redislua.E006"]
        assert [client.get("/uses-another-policy/").status_code for _ in range(3)] == [
            200, 200, 429,
        ]
        assert client.get("/unknown-policy/").status_code == 200  # "typo" is broken: FAIL_OPEN


@pytest.mark.parametrize(
    ("connection", "caches", "check_id", "text"),
    [
        ("redis://127.0.0.1:abc/0", None, "redislua.E002", "port 'abc' is not a number"),
        ("redis://127.0.0.1:99999/0", None, "redislua.E002", "port '99999'"),
        ("redis://127.0.0.1:6379/zero", None, "redislua.E002", "database 'zero'"),
        ("redis+cluster://127.0.0.1:7x", None, "redislua.E002", "port '7x'"),
        ("redis+sentinel://h:1,h:two/mymaster", None, "redislua.E002", "port 'two'"),
        ("unix://", None, "redislua.E002", "names no socket path"),
        ("c", {"BACKEND": "django.core.cache.backends.redis.RedisCache",
               "LOCATION": "127.0.0.1:6379"}, "redislua.E002", "is not a Redis URL"),
        ("c", {"BACKEND": "django_redis.cache.RedisCache",
               "LOCATION": "redis://127.0.0.1:port/0"}, "redislua.E002", "port 'port'"),
        ("c", {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://mymaster/0",
               "OPTIONS": {"SENTINELS": ["h:1"]}}, "redislua.E002", "(host, port) pairs"),
    ],
)
def test_malformed_connections_are_checks_and_never_500(
    connection: str, caches: dict[str, object] | None, check_id: str, text: str
) -> None:
    from django.conf import settings

    all_caches = {**settings.CACHES, "c": caches} if caches else settings.CACHES
    client = Client(raise_request_exception=True)
    with override_settings(CACHES=all_caches), redislua(CONNECTION=connection):
        found = [(m.id, m.msg) for m in check_settings()]
        assert [i for i, _ in found] == [check_id] and text in found[0][1], found
        assert "***" in found[0][1] or "@" not in found[0][1]
        assert client.get("/rl/inline/").status_code == 200  # FAIL_OPEN
        with redislua(CONNECTION=connection, FAIL_OPEN=False):
            assert client.get("/rl/inline/").status_code == 503


def test_a_password_never_appears_in_a_check_message() -> None:
    with redislua(CONNECTION="redis://user:s3cret@127.0.0.1:bad/0"):
        (message,) = check_settings()
    assert "s3cret" not in message.msg and "user:***@" in message.msg


def test_a_bad_global_drf_rate_is_reported_once() -> None:
    from django.conf import settings

    bad = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"anon": "3/x", "user": "5/m"}}
    with override_settings(REST_FRAMEWORK=bad):
        found = [m.id for m in [*check_settings(), *check_views()]]
    assert found == ["redislua.E020"]


def test_a_bad_rate_used_only_by_a_routed_view_is_reported() -> None:
    """Our throttles not global, but on a routed view (/m/drf/ has them as its class
    attribute): the per-view walk reports the rate, once."""
    bad = {"DEFAULT_THROTTLE_CLASSES": [], "DEFAULT_THROTTLE_RATES": {"anon": "3/x",
                                                                      "user": "5/m"}}
    with override_settings(REST_FRAMEWORK=bad):
        assert check_settings() == []
        found = [(m.id, m.msg) for m in check_views()]
    assert [i for i, _ in found] == ["redislua.E020"]
    assert "AnonRateThrottle on m/drf/: scope 'anon'" in found[0][1]


# -- a setting the app cannot read: reported by its check, and the app runs on its default --

@pytest.mark.parametrize("bad", [{"SOCKET_TIMEOUT": "soon"}, {"CONNECTION_OPTIONS": 3},
                                 {"TRUSTED_PROXIES": "x"}, {"IPV4_MASK": None}])
def test_a_setting_the_app_cannot_read_still_limits_on_its_default(bad):
    from django.conf import settings

    client = Client(raise_request_exception=True)
    with override_settings(REDISLUA={**settings.REDISLUA, **bad}):
        assert [client.get("/rl/inline/").status_code for _ in range(4)] == [200, 200, 200, 429]


def test_a_bad_claim_window_leaves_locks_working_on_the_default(settings):
    from django_redislua.conf import settings as redislua_settings
    from django_redislua.locks import Lock

    settings.REDISLUA = {**settings.REDISLUA, "LOCK_CLAIM_WINDOW": "soon"}
    assert redislua_settings.LOCK_CLAIM_WINDOW == 1.0
    with Lock("bad-window", timeout=5) as lock:
        assert lock.owned()
