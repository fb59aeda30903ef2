"""Key functions: request -> identity, including hostile and malformed input."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser
from django.test import Client, RequestFactory, override_settings
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from django_redislua import keys
from django_redislua.keys import client_ip, key_function
from django_redislua.limiting import PolicyError, get_policy
from django_redislua.limiting.identity import ABSENT, bound_identity
from tests.settings import REDISLUA

rf = RequestFactory()


def with_config(**options: object) -> override_settings:
    return override_settings(REDISLUA={**REDISLUA, **options})


@pytest.mark.parametrize(("remote", "expected"), [
    ("203.0.113.9", "203.0.113.9"),
    ("2001:db8::1", "2001:db8::/64"),
    ("::ffff:203.0.113.9", "203.0.113.9"),  # IPv4-mapped: counted as the IPv4 client
    ("[2001:db8::1]:443", "2001:db8::/64"),
    ("203.0.113.9:5555", "203.0.113.9"),
    ("fe80::1%eth0", "fe80::/64"),
    ("", None), ("garbage", None), ("999.1.1.1", None), ("1.2.3.4, 5.6.7.8", None),
    ("1" * 500, None), ("\x00\n", None),
])
@pytest.mark.unit
def test_client_ip_remote_addr(remote: str, expected: str | None) -> None:
    assert client_ip(rf.get("/", REMOTE_ADDR=remote)) == expected


@pytest.mark.unit
def test_client_ip_missing_remote_addr() -> None:
    request = rf.get("/")
    del request.META["REMOTE_ADDR"]
    assert client_ip(request) is None


@pytest.mark.unit
@with_config(IPV4_MASK=24, IPV6_MASK=48)
def test_masks() -> None:
    assert client_ip(rf.get("/", REMOTE_ADDR="203.0.113.9")) == "203.0.113.0/24"
    assert client_ip(rf.get("/", REMOTE_ADDR="2001:db8:1:2::1")) == "2001:db8:1::/48"


@pytest.mark.unit
def test_a_remembered_address_is_masked_anew_when_the_masks_change() -> None:
    """Addresses are remembered once masked (keys._masked_by): under the masks they were
    masked with, never under settings changed since."""
    request = rf.get("/", REMOTE_ADDR="203.0.113.9")
    assert client_ip(request) == "203.0.113.9"
    with with_config(IPV4_MASK=24):
        assert client_ip(request) == "203.0.113.0/24"
    assert client_ip(request) == "203.0.113.9"


@pytest.mark.unit
def test_only_short_address_values_are_remembered() -> None:
    """Junk cannot crowd the cache with big entries: a value over REMEMBERED_ADDRESS_TEXT is
    read each time (and is still an address when padding is all that made it long)."""
    keys._masked_by.cache_clear()
    padded = " " * keys.REMEMBERED_ADDRESS_TEXT + "203.0.113.9"
    assert client_ip(rf.get("/", REMOTE_ADDR=padded)) == "203.0.113.9"
    assert client_ip(rf.get("/", REMOTE_ADDR="x" * 129)) is None
    assert keys._masked_by.cache_info().currsize == 0
    assert client_ip(rf.get("/", REMOTE_ADDR="203.0.113.9")) == "203.0.113.9"
    assert keys._masked_by.cache_info().currsize == 1


@pytest.mark.unit
@with_config(TRUSTED_PROXIES=2)
def test_trusted_proxies_take_the_nth_from_the_right() -> None:
    # client-forged, real client (appended by proxy 1), proxy 1 (appended by proxy 2)
    forwarded = "6.6.6.6, 198.51.100.7, 10.0.0.1"
    request = rf.get("/", REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR=forwarded)
    assert client_ip(request) == "198.51.100.7"


@pytest.mark.unit
@with_config(TRUSTED_PROXIES=1)
def test_trusted_proxies_fall_back_to_the_peer() -> None:
    assert client_ip(rf.get("/", REMOTE_ADDR="198.51.100.7")) == "198.51.100.7"
    garbage = rf.get("/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="not-an-ip")
    assert client_ip(garbage) is None
    huge = rf.get("/", REMOTE_ADDR="10.0.0.1",
                  HTTP_X_FORWARDED_FOR="6.6.6.6," * 100_000 + " 1.1.1.1")
    assert client_ip(huge) == "1.1.1.1"


# -- X-Forwarded-For, as an attacker writes it -----------------------------------------------------
HOSTILE_PREFIX = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=64
) | st.builds(lambda unit, n: unit * n, st.sampled_from(["6.6.6.6,", ",", "x" * 50, "::1, "]),
              st.integers(1, 20_000))
ADDRESSES = st.ip_addresses().map(str)


@pytest.mark.unit
@given(prefix=HOSTILE_PREFIX, proxies=st.integers(1, 3), appended=st.data())
@hsettings(max_examples=300, deadline=None)
def test_forwarded_for_fuzz_the_identity_is_the_trusted_entry(
    prefix: str, proxies: int, appended: st.DataObject
) -> None:
    """For any client-controlled prefix (any length, any characters), the identity is the entry
    TRUSTED_PROXIES places from the right, masked, or the shared unknown identity."""
    from django_redislua.keys import UNKNOWN_ADDRESS, masked

    # What the trusted proxies append: the peer each saw, the first one being the client.
    hops = [appended.draw(ADDRESSES | st.sampled_from(["", "garbage", "1.2.3.4:80"]))
            for _ in range(proxies)]
    header = ", ".join([prefix, *hops])
    request = rf.get("/", REMOTE_ADDR="10.9.9.9", HTTP_X_FORWARDED_FOR=header)
    with with_config(TRUSTED_PROXIES=proxies):
        expected = masked(hops[0].strip()) or UNKNOWN_ADDRESS
        assert key_function("ip")(request) == expected
        assert len(expected) <= 64


@pytest.mark.unit
@with_config(TRUSTED_PROXIES=1)
def test_forwarded_for_of_4kb_no_longer_chooses_the_identity() -> None:
    """The bug: the header was cut to its first 4 KB, dropping the proxy's entry at the end."""
    header = "6.6.6." + "6" * 5000 + ", 7.7.7.7"
    assert key_function("ip")(rf.get("/", REMOTE_ADDR="10.0.0.1",
                                     HTTP_X_FORWARDED_FOR=header)) == "7.7.7.7"


@pytest.mark.unit
@pytest.mark.parametrize("remote", ["", "garbage", None])
def test_an_undeterminable_address_is_limited_under_one_shared_identity(
    remote: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    from django_redislua.keys import UNKNOWN_ADDRESS

    request = rf.get("/", REMOTE_ADDR=remote or "")
    if remote is None:
        del request.META["REMOTE_ADDR"]
    with caplog.at_level("WARNING", logger="django_redislua"):
        assert key_function("ip")(request) == UNKNOWN_ADDRESS
        assert key_function("ip")(request) == UNKNOWN_ADDRESS
    assert caplog.text.count("redislua.W003") == 1  # logged once, not per request


@pytest.mark.django_db
def test_unix_socket_deployments_without_remote_addr_are_still_limited(client: Client) -> None:
    statuses = [client.post("/rl/login/", REMOTE_ADDR="").status_code for _ in range(7)]
    assert statuses == [200] * 5 + [429] * 2  # the login policy: 5/m, by address


@pytest.mark.unit
def test_without_trusted_proxies_the_header_is_ignored() -> None:
    request = rf.get("/", REMOTE_ADDR="198.51.100.7", HTTP_X_FORWARDED_FOR="6.6.6.6")
    assert client_ip(request) == "198.51.100.7"


@pytest.mark.unit
@pytest.mark.django_db
def test_user_keys(django_user_model) -> None:  # type: ignore[no-untyped-def]
    user = django_user_model.objects.create_user("k", password="pw")
    request = rf.get("/", REMOTE_ADDR="198.51.100.7")
    request.user = AnonymousUser()
    assert key_function("user")(request) is None
    assert key_function("user_or_ip")(request) == "198.51.100.7"
    request.user = user
    assert key_function("user")(request) == f"u{user.pk}"
    assert key_function("user_or_ip")(request) == f"u{user.pk}"


@pytest.mark.unit
def test_param_and_header_keys() -> None:
    request = rf.post("/?q=find", {"email": "a@x"}, HTTP_X_API_KEY="k1", REMOTE_ADDR="1.2.3.4")
    assert key_function("header:X-Api-Key")(request) == "k1"
    assert key_function("header:x_api_key")(request) == "k1"
    assert key_function("get:q")(request) == "find"
    assert key_function("post:email")(request) == "a@x"
    assert key_function("get:missing")(request) is ABSENT  # limited together, never skipped
    assert key_function("post:missing")(request) is ABSENT
    assert key_function("header:x-missing")(request) is ABSENT
    assert key_function("header:content-type")(request).startswith("multipart/form-data")


@pytest.mark.unit
def test_callable_and_dotted_keys() -> None:
    request = rf.get("/", HTTP_X_TENANT="t1")
    assert key_function(lambda r: "fixed")(request) == "fixed"
    assert key_function("tests.testapp.ratelimit_views.tenant_key")(request) == "t1"


@pytest.mark.unit
@pytest.mark.parametrize("spec", ["nope", "cookie:x", "header:", 42, "no.such.module.key"])
def test_unknown_keys_are_policy_errors(spec: object) -> None:
    with pytest.raises(PolicyError) as info:
        key_function(spec)
    assert info.value.check_id == "redislua.E008"


@pytest.mark.unit
@given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
@hsettings(max_examples=200, deadline=None)
def test_hostile_values_make_safe_keys(value: str) -> None:
    key = get_policy("api").redis_key(value)
    tag = key[key.index("{") + 1 : -1]
    assert key.count("{") == 1 and key.endswith("}")  # one hash tag: one cluster slot
    assert 1 <= len(tag) <= 64 and tag.isprintable() and " " not in tag
    assert bound_identity(value) == tag


@pytest.mark.django_db
def test_hostile_header_values_over_http(client: Client, r) -> None:  # type: ignore[no-untyped-def]
    hostile = ["}{", "a" * 10_000, "x\r\ny", "{tag}", "#abc", "ünïcode", "*", "../.."]
    for value in hostile:
        assert client.get("/rl/by-header/", HTTP_X_API_KEY=value).status_code == 200
    keys = r.keys("rl:*")
    assert len(keys) == len(hostile)  # each value its own counter
    assert all(len(k) < 200 and k.count(b"{") == 1 for k in keys)
