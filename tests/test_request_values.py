"""Keys that read a request value (``post:``, ``get:``, ``header:``) on every layer: the
decorator, the middleware, DRF's PolicyThrottle and compat; as a form, a JSON body and DRF's
``request.data``; present, absent, hostile; and a policy's ``normalize``.

Issue 35: a DRF login posting JSON was never limited by a ``post:username`` policy, and a
request that left the field out skipped the limit. Each test here failed on the code before.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from django.conf import settings as django_settings
from django.test import Client, RequestFactory, override_settings

from django_redislua.connection import get_client
from django_redislua.keys import JSON_BODY_LIMIT, body_field, key_function, normalized
from django_redislua.limiting.identity import ABSENT, ABSENT_TEXT, bound_identity, is_bound
from django_redislua.testing import free_port
from tests.processes import stop_group
from tests.settings import MIDDLEWARE, REDISLUA
from tests.testapp.login_policies import MIDDLEWARE_POLICIES, POLICIES, RATE

pytestmark = pytest.mark.urls("tests.testapp.login_views")
ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("deco", "mw", "drf", "compat")
LIMIT = int(RATE.partition("/")[0])
rf = RequestFactory()


@pytest.fixture(autouse=True)
def _installed() -> Iterator[None]:
    with override_settings(
        MIDDLEWARE=[*MIDDLEWARE, "django_redislua.middleware.RateLimitMiddleware"],
        REDISLUA={**REDISLUA, "POLICIES": {**REDISLUA["POLICIES"], **POLICIES},  # type: ignore[dict-item]
                  "MIDDLEWARE_POLICIES": MIDDLEWARE_POLICIES},
    ):
        yield


def limited(layer: str, status: int) -> bool:
    """Refused by the limit: 429 (compat's Ratelimited too: RateLimitMiddleware is installed)."""
    return status == 429


def post(client: Client, url: str, body: Any, as_json: bool, **extra: Any) -> int:
    if as_json:
        return client.post(url, json.dumps(body), content_type="application/json",
                           **extra).status_code
    return client.post(url, body, **extra).status_code


# -- the login of the issue, on every layer --------------------------------------------------------
@pytest.mark.parametrize("as_json", [False, True], ids=["form", "json"])
@pytest.mark.parametrize("layer", LAYERS)
def test_a_login_is_limited_by_username_as_a_form_and_as_json(
    client: Client, layer: str, as_json: bool
) -> None:
    url = f"/{layer}/login/"
    statuses = [post(client, url, {"username": "alice", "password": f"guess{i}"}, as_json)
                for i in range(LIMIT + 3)]
    assert statuses[:LIMIT] == [401] * LIMIT
    assert all(limited(layer, s) for s in statuses[LIMIT:]), statuses
    # another username is another budget, on the same client address
    assert post(client, url, {"username": "bob", "password": "x"}, as_json) == 401


@pytest.mark.parametrize("as_json", [False, True], ids=["form", "json"])
@pytest.mark.parametrize("layer", LAYERS)
def test_leaving_out_the_username_is_limited_under_one_shared_identity(
    client: Client, layer: str, as_json: bool
) -> None:
    url = f"/{layer}/login/"
    # left out, renamed, empty, null (JSON), whitespace-free garbage field names: one budget
    bodies: list[dict[str, Any]] = [
        {"password": "a"}, {"user": "alice", "password": "b"}, {"username": "", "password": "c"},
        {"Username": "alice", "password": "d"}, {"password": "e"},
    ]
    if as_json:
        bodies[2] = {"username": None, "password": "c"}
    statuses = [post(client, url, body, as_json) for body in bodies]
    assert statuses == [401] * LIMIT
    again = post(client, url, {"login": "alice", "password": "f"}, as_json)
    assert limited(layer, again), again
    # a request that does give the field is not in that budget
    assert post(client, url, {"username": "alice", "password": "g"}, as_json) == 401


# -- every key kind on every layer -----------------------------------------------------------------
def send(client: Client, layer: str, kind: str, value: str | None, as_json: bool = False) -> int:
    url = f"/{layer}/{kind}/"
    if kind == "post":
        body = {} if value is None else {"username": value}
        return post(client, url, body, as_json)
    if kind == "get":
        return client.get(url, {} if value is None else {"q": value}).status_code
    headers = {} if value is None else {"HTTP_X_API_KEY": value}
    return client.get(url, **headers).status_code


KINDS = [("post", False), ("post", True), ("get", False), ("header", False)]


@pytest.mark.parametrize(("kind", "as_json"), KINDS, ids=["post-form", "post-json", "get",
                                                          "header"])
@pytest.mark.parametrize("layer", LAYERS)
def test_every_key_kind_on_every_layer(client: Client, layer: str, kind: str,
                                       as_json: bool) -> None:
    first = [send(client, layer, kind, "a", as_json) for _ in range(LIMIT + 1)]
    assert first[:LIMIT] == [200] * LIMIT and limited(layer, first[LIMIT]), first
    assert send(client, layer, kind, "b", as_json) == 200  # another value, another budget
    absent = [send(client, layer, kind, None, as_json) for _ in range(LIMIT)]
    absent += [send(client, layer, kind, "", as_json)]  # empty is absent too
    assert absent[:LIMIT] == [200] * LIMIT and limited(layer, absent[LIMIT]), absent


@pytest.mark.parametrize("layer", ["deco", "mw", "drf"])
def test_the_absent_identity_is_the_documented_one(client: Client, layer: str) -> None:
    assert send(client, layer, "header", None) == 200
    keys = [k.decode() for k in get_client().scan_iter(match="rl:rv-header:*")]
    assert keys == [f"rl:rv-header:sl:{{{ABSENT_TEXT}}}"]


def test_a_field_named_like_the_absent_identity_is_not_it() -> None:
    assert bound_identity(ABSENT) == ABSENT_TEXT == "#absent"
    sent = bound_identity("#absent")  # a request that sends the text: a digest, another budget
    assert sent != ABSENT_TEXT and sent.startswith("#") and len(sent) == 23
    assert is_bound(ABSENT_TEXT)
    request = rf.post("/", {"username": "#absent"})
    assert key_function("post:username")(request) == "#absent"
    assert key_function("post:username")(request) is not ABSENT


# -- reading the field: the forms a body takes, hostile ones included (no Redis) -------------------
def json_request(body: bytes | str, content_type: str = "application/json") -> Any:
    return rf.post("/", body, content_type=content_type)


@pytest.mark.parametrize(("body", "expected"), [
    ('{"username": "alice"}', "alice"),
    ('{"username": 42}', "42"),  # a number is the identity its text is: "42" and 42 are one
    ('{"username": "42"}', "42"),
    ('{"username": 1.5}', "1.5"),
    ('{"username": true}', "true"),
    ('{"username": null}', None),
    ('{"username": ""}', None),
    ('{"username": ["a", "b"]}', '["a","b"]'),  # canonical JSON, bounded like any value
    ('{"username": {"b": 1, "a": 2}}', '{"a":2,"b":1}'),
    ('{"other": "alice"}', None),
    ('["username", "alice"]', None),  # not an object
    ('"alice"', None),
    ("42", None),
    ("null", None),
    ("{not json", None),
    ("", None),
])
def test_a_json_body_field(body: str, expected: str | None) -> None:
    assert body_field(json_request(body), "username") == expected


@pytest.mark.parametrize("content_type", [
    "application/json", "application/json; charset=utf-8", "application/vnd.api+json",
    "application/problem+json",
])
def test_json_content_types(content_type: str) -> None:
    assert body_field(json_request('{"username": "a"}', content_type), "username") == "a"


def test_a_body_that_is_not_json_is_not_parsed_as_json() -> None:
    assert body_field(json_request('{"username": "a"}', "text/plain"), "username") is None
    assert body_field(rf.post("/", {"username": "a"}), "username") == "a"  # a form


def test_invalid_utf8_is_no_field() -> None:
    assert body_field(json_request(b'{"username": "\xff\xfe\xfa"}'), "username") is None


def test_deep_nesting_is_no_field_and_bounded() -> None:
    started = time.perf_counter()
    for body in ("[" * 200_000 + "]" * 200_000, '{"a":' * 100_000 + "1" + "}" * 100_000):
        assert body_field(json_request(body), "username") is None
    assert time.perf_counter() - started < 5  # a generous bound: a RecursionError, not a hang


def test_a_body_above_the_limit_is_never_read() -> None:
    huge = json_request('{"username": "alice", "pad": "' + "x" * (10 * 1024 * 1024) + '"}')
    assert body_field(huge, "username") is None
    assert not hasattr(huge, "_body")  # not read: the view may still read (or refuse) it


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=None)
def test_without_djangos_limit_the_json_limit_applies() -> None:
    fits = '{"username": "alice", "pad": "' + "x" * (JSON_BODY_LIMIT - 40) + '"}'
    assert body_field(json_request(fits), "username") == "alice"
    above = '{"username": "alice", "pad": "' + "x" * JSON_BODY_LIMIT + '"}'
    assert body_field(json_request(above), "username") is None


def test_a_lying_content_length_is_no_field() -> None:
    request = json_request('{"username": "alice"}')
    request.META["CONTENT_LENGTH"] = "not a number"
    assert body_field(request, "username") is None


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("body", [
    b'{"username": "' + b"x" * (10 * 1024 * 1024) + b'"}',  # 10 MB
    b"[" * 100_000 + b"]" * 100_000,  # nested
    b'["alice"]', b"42", b'"alice"',  # not an object
    b'{"username": "\xff\xfe"}',  # invalid UTF-8
    b'{"username": ["alice", "alice2"]}', b'{"username": 12345}',  # a list, a number
    b"{broken",
], ids=["10MB", "nested", "list", "number", "string", "bad-utf8", "field-list", "field-number",
        "broken"])
def test_hostile_json_gets_a_clear_decision_never_a_500(client: Client, layer: str,
                                                        body: bytes) -> None:
    statuses = [client.post(f"/{layer}/login/", body, content_type="application/json").status_code
                for _ in range(LIMIT + 1)]
    # the view's own answer (401; DRF's 400 for a body it cannot parse, 413-like refusals as
    # Django's 400), and once the budget is spent, the limit: never a 500
    assert all(s < 500 for s in statuses), statuses
    if statuses == [400] * (LIMIT + 1):
        assert layer == "drf", statuses  # DRF refuses a body it cannot parse (or too large)
        return  # before any view runs: nothing to limit
    assert limited(layer, statuses[LIMIT]), statuses
    keys = list(get_client().scan_iter(match="rl:*"))
    assert len(keys) == 1 and len(keys[0]) < 120, keys  # one bounded key


def test_a_number_and_its_text_are_one_budget(client: Client) -> None:
    for i in range(LIMIT):
        body = {"username": 42 if i % 2 else "42", "password": "x"}
        assert post(client, "/deco/login/", body, True) == 401
    assert post(client, "/deco/login/", {"username": 42, "password": "x"}, True) == 429


# -- normalize -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("raw", "expected"), [
    ("Mallory ", "mallory"), ("  MALLORY\t", "mallory"), ("\uff2d\uff41llory", "mallory"),
    ("Stra\u00dfe", "strasse"), ("e\u0301", "\u00e9"), ("   ", ABSENT), ("u42", "u42"),
])
def test_normalized(raw: str, expected: str) -> None:
    assert normalized(raw) == expected


def test_normalized_keeps_the_absent_identity_and_non_text() -> None:
    assert normalized(ABSENT) is ABSENT
    assert normalized(42) == 42
    assert normalized(b"Abc") == b"Abc"


@pytest.mark.parametrize("normalize", [True, False])
def test_a_normalizing_policy_counts_one_attacker_however_they_type(
    client: Client, normalize: bool
) -> None:
    policies = {**POLICIES, "login-user": {**POLICIES["login-user"], "normalize": normalize}}
    with override_settings(REDISLUA={**REDISLUA, "POLICIES": policies}):
        names = ["Mallory ", "mallory", "MALLORY", " Mallory", "\uff4dallory", "mallory"]
        statuses = [post(client, "/deco/login/", {"username": n, "password": "x"}, True)
                    for n in names]
    if normalize:
        assert statuses == [401] * LIMIT + [429]
    else:
        assert statuses == [401] * 6  # five spellings, each its own budget


# -- as deployed: the DRF JSON login under gunicorn ------------------------------------------------
def http_post(port: int, path: str, body: bytes, content_type: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body, {"Content-Type": content_type})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


@contextmanager
def gunicorn() -> Iterator[int]:
    """tests/login_settings.py (the login views) under gunicorn, 2 sync workers."""
    port = free_port()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.login_settings",
           "REDIS_URL": django_settings.REDIS_URL,
           "REDISLUA_CONNECTION": django_settings.REDIS_URL, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONWARNINGS", None)
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--workers", "2", "--bind", f"127.0.0.1:{port}",
             "tests.wsgi:application"],
            cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)
        try:
            deadline = time.monotonic() + 40
            while True:
                try:
                    # a GET of the login: DRF answers 405 once the app serves
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                    conn.request("GET", "/deco/get/?q=ready")
                    conn.getresponse().read()
                    conn.close()
                    break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        raise RuntimeError("gunicorn did not start:\n"
                                           + log.read().decode()[-3000:]) from None
                    time.sleep(0.2)
            yield port
        finally:
            stop_group(process)


@pytest.mark.slow
def test_a_drf_json_login_under_gunicorn_is_limited_by_username() -> None:
    with gunicorn() as port:
        def attempt(body: dict[str, Any], content_type: str = "application/json") -> int:
            data = (json.dumps(body) if content_type == "application/json"
                    else urlencode(body)).encode()
            return http_post(port, "/drf/login/", data, content_type)

        json_login = [attempt({"username": "alice", "password": f"guess{i}"}) for i in range(8)]
        form = "application/x-www-form-urlencoded"
        form_login = [attempt({"username": "carol", "password": f"g{i}"}, form) for i in range(8)]
        left_out = [attempt({"password": f"guess{i}"}) for i in range(8)]
    assert json_login == [401] * 5 + [429] * 3  # was 8 x 401: never limited
    assert form_login == [401] * 5 + [429] * 3
    assert left_out == [401] * 5 + [429] * 3  # was 8 x 401: leaving the field out skipped it
