"""Live overrides take the identity a policy's key yields, or what a person naturally has (a
User, a request, an address), and refuse one the key could never yield (issue 35: the docs
taught ``overrides.allow("api", "42")``; the ``user`` keys yield ``"u42"``, so the override was
stored, never matched, and nothing warned)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory, override_settings
from django.urls import path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redislua import drf, overrides
from django_redislua.decorators import ratelimit
from django_redislua.limiting.decision import ALLOW, BLOCK
from django_redislua.limiting.identity import ABSENT
from django_redislua.limiting.registry import get_policy
from tests.settings import REDISLUA

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.test_override_identities")]
ROOT = Path(__file__).resolve().parent.parent
POLICIES = {
    **REDISLUA["POLICIES"],  # type: ignore[dict-item]
    "per-user": {"algorithm": "fixed_window", "rate": "2/m", "key": "user"},
    "per-ip": {"algorithm": "fixed_window", "rate": "2/m", "key": "ip"},
    "per-header": {"algorithm": "fixed_window", "rate": "2/m", "key": "header:x-api-key",
                   "normalize": True},
}
rf = RequestFactory()


def ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


class Anonymous(APIView):
    throttle_classes = [drf.AnonRateThrottle]
    authentication_classes: list[type] = []

    def get(self, request: Request) -> Response:
        return Response({"ok": True})


urlpatterns = [path(f"{name}/", ratelimit(name)(ok)) for name in POLICIES]
urlpatterns += [path("anon/", Anonymous.as_view())]


@pytest.fixture(autouse=True)
def _policies() -> Any:
    with override_settings(REDISLUA={**REDISLUA, "POLICIES": POLICIES}):
        yield


@pytest.fixture
def user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("alice", password="pw")


def test_the_identity_the_docs_show_is_the_one_the_code_produces(client: Client,
                                                                 user: Any) -> None:
    client.force_login(user)
    assert [client.get("/per-user/").status_code for _ in range(3)] == [200, 200, 429]
    with pytest.raises(ValueError, match=f"write 'u{user.pk}' for user {user.pk}"):
        overrides.allow("per-user", str(user.pk), ttl="1h", reason="partner")
    assert list(overrides.scan()) == []  # nothing stored that would never match
    made = overrides.allow("per-user", user, ttl="1h", reason="partner")  # the User itself
    assert made.identity == f"u{user.pk}"
    response = client.get("/per-user/")
    assert response.status_code == 200
    assert overrides.get("per-user", f"u{user.pk}") is not None  # the string form reads it
    assert overrides.get("per-user", user) is not None
    assert overrides.clear("per-user", user)


def test_a_request_gives_the_identity_its_policys_key_yields(client: Client) -> None:
    request = rf.get("/", REMOTE_ADDR="203.0.113.7")
    made = overrides.block("per-ip", request, ttl="1h", reason="stuffing")
    assert made.identity == "203.0.113.7"
    response = client.get("/per-ip/", REMOTE_ADDR="203.0.113.7")
    assert response.status_code == 429 and get_policy("per-ip").peek("203.0.113.7").override \
        == BLOCK
    assert client.get("/per-ip/", REMOTE_ADDR="203.0.113.8").status_code == 200
    header = rf.get("/", HTTP_X_API_KEY="  Key-One ")
    assert overrides.allow("per-header", header, ttl="1h").identity == "key-one"  # normalized
    assert overrides.allow("per-header", "KEY-ONE", ttl="1h").identity == "key-one"


def test_an_address_is_masked_as_the_ip_key_masks_it(client: Client) -> None:
    with override_settings(REDISLUA={**REDISLUA, "POLICIES": POLICIES, "IPV4_MASK": 24}):
        made = overrides.block("per-ip", "203.0.113.7", ttl="1h")
        assert made.identity == "203.0.113.0/24"
        assert client.get("/per-ip/", REMOTE_ADDR="203.0.113.99").status_code == 429
        assert overrides.block("per-ip", "203.0.113.0/24", ttl="1h").identity == "203.0.113.0/24"
        with pytest.raises(ValueError, match=re.escape("never yields '203.0.113.0/16'")):
            overrides.block("per-ip", "203.0.113.0/16", ttl="1h")


@pytest.mark.parametrize(("policy", "identity", "said"), [
    ("per-user", "42", "write 'u42' for user 42"),
    ("per-user", "alice", "'u' and the user's primary key"),
    ("per-user", "203.0.113.7", "'u' and the user's primary key"),
    ("per-ip", "u42", "an address as the ip key masks it"),
    ("per-ip", "not-an-address", "an address as the ip key masks it"),
    ("api", "42", "write 'u42' for user 42"),  # user_or_ip
    ("anon", "1.2.3.4.5", "throttle_anon_"),  # DRF's scope: its cache key
])
def test_an_identity_the_key_never_yields_is_refused(policy: str, identity: str,
                                                     said: str) -> None:
    with pytest.raises(ValueError, match=said):
        overrides.block(policy, identity, ttl="1h")
    assert list(overrides.scan()) == []


def test_every_form_the_user_keys_yield_is_taken(user: Any) -> None:
    assert overrides.block("api", "u7", ttl="1h").identity == "u7"  # user_or_ip: a user
    assert overrides.block("api", "198.51.100.1", ttl="1h").identity == "198.51.100.1"
    assert overrides.block("api", "2001:db8::1", ttl="1h").identity == "2001:db8::/64"
    assert overrides.block("api", "unknown-address", ttl="1h").identity == "unknown-address"
    assert overrides.block("per-header", "#absent", ttl="1h").identity == ABSENT


def test_a_drf_scope_takes_its_throttles_identity(client: Client) -> None:
    made = overrides.block("anon", "198.51.100.9", ttl="1h")  # DRF's key for an address
    assert made.identity == "throttle_anon_198.51.100.9"
    assert client.get("/anon/", REMOTE_ADDR="198.51.100.9").status_code == 429
    assert client.get("/anon/", REMOTE_ADDR="198.51.100.10").status_code == 200


def test_star_takes_any_identity_and_a_user() -> None:
    assert overrides.block("*", "anything at all", ttl="1h").identity == "anything at all"


def test_star_refuses_a_request_it_cannot_key(user: Any) -> None:
    assert overrides.block("*", user, ttl="1h").identity == f"u{user.pk}"
    with pytest.raises(ValueError, match="each policy keys a request its own way"):
        overrides.block("*", rf.get("/"), ttl="1h")


def test_an_override_stored_before_the_check_can_still_be_read_and_cleared() -> None:
    from django_redislua.connection import get_client
    from django_redislua.limiting.definition import overrides_key

    # what the old code stored for overrides.allow("per-user", "42")
    get_client().hset(overrides_key("42"), "per-user", f"a|{(time.time() + 3600) * 1e6:.0f}")
    assert overrides.get("per-user", "42") is not None
    assert overrides.clear("per-user", "42")


@pytest.mark.slow
def test_an_override_set_by_another_process_is_honoured_within_a_second(
    client: Client, user: Any
) -> None:
    client.force_login(user)
    statuses = [client.get("/api/").status_code for _ in range(25)]  # gcra, burst 20
    assert statuses[-1] == 429  # and this process now remembers the denial (its local cache)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
           "REDIS_URL": django_settings.REDIS_URL, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONWARNINGS", None)
    done = subprocess.run(
        [sys.executable, "-m", "django", "redislua_override", "allow", "api", f"u{user.pk}",
         "--ttl", "1h", "--reason", "partner"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert f"api 'u{user.pk}': allow until" in done.stdout
    deadline = time.monotonic() + 1.5  # the documented horizon of a local denial: 1 s
    while client.get("/api/").status_code == 429:
        assert time.monotonic() < deadline, "the override was not honoured within 1 s"
        time.sleep(0.05)
    assert get_policy("api").hit(f"u{user.pk}").override == ALLOW
