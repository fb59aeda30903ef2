"""One test per system check id: `manage.py check` reports each malformed setting by its id."""

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_redislua.checks import check_settings


def ids(**redislua):
    with override_settings(REDISLUA=redislua):
        return [m.id for m in check_settings()]


def policy(**options):
    return ids(CONNECTION="default", POLICIES={"p": options})


def test_valid_settings_have_no_messages():
    assert policy(rate="5/m", algorithm="gcra", burst=3, key="user_or_ip") == []
    assert ids(CONNECTION="redis://127.0.0.1:6379/0") == []


def test_manage_py_check_names_the_id():
    bad = {"POLICIES": {"p": {"rate": "5/m", "algorithm": "nope"}}}
    with override_settings(REDISLUA=bad), pytest.raises(SystemCheckError, match=r"redislua\.E005"):
        call_command("check", stdout=StringIO(), stderr=StringIO())


def test_e001_not_a_dict():
    with override_settings(REDISLUA=["nope"]):
        assert [m.id for m in check_settings()] == ["redislua.E001"]


def test_e002_unknown_cache_alias_or_bad_url():
    assert ids(CONNECTION="nosuchcache") == ["redislua.E002"]
    assert ids(CONNECTION="http://example.invalid") == ["redislua.E002"]
    assert ids(CONNECTION="redis+sentinel://127.0.0.1:26379") == ["redislua.E002"]


def test_e003_non_redis_cache_backend():
    assert ids(CONNECTION="locmem") == ["redislua.E003"]


def test_e004_policies_not_a_dict_or_policy_not_a_dict():
    assert ids(POLICIES=["x"]) == ["redislua.E004"]
    assert ids(POLICIES={"p": "5/m"}) == ["redislua.E004"]


def test_e005_unknown_algorithm():
    assert policy(rate="5/m", algorithm="leaky") == ["redislua.E005"]


def test_a_zero_rate_is_valid_and_denies_everything():
    assert policy(rate="0/m") == [] and policy(rate="0/h", algorithm="gcra") == []


@pytest.mark.parametrize("rate", ["5", "5/fortnight", "-1/m", "x/m", "5/0s", 5])
def test_e006_bad_rate(rate):
    assert policy(rate=rate) == ["redislua.E006"]


def test_e006_missing_rate_and_bad_dotted_path():
    assert policy(algorithm="gcra") == ["redislua.E006"]
    assert policy(rate="tests.nowhere.rate") == ["redislua.E006"]


@pytest.mark.parametrize("burst", [-1, 0, 2.5, "3"])
def test_e007_bad_burst(burst):
    assert policy(rate="5/m", algorithm="token_bucket", burst=burst) == ["redislua.E007"]


def test_e007_burst_on_a_window_algorithm():
    assert policy(rate="5/m", algorithm="fixed_window", burst=3) == ["redislua.E007"]


@pytest.mark.parametrize("key", ["ipaddress", "cookie:x", "header:", 42, "tests.nowhere.key"])
def test_e008_unknown_key_type(key):
    assert policy(rate="5/m", key=key) == ["redislua.E008"]


@pytest.mark.parametrize("timeout", ["soon", -5, "10 fortnights"])
def test_e009_bad_duration(timeout):
    assert policy(algorithm="concurrency", limit=2, timeout=timeout) == ["redislua.E009"]


def test_e010_concurrency_limit():
    assert policy(algorithm="concurrency") == ["redislua.E010"]
    assert policy(algorithm="concurrency", limit=0) == ["redislua.E010"]
    assert policy(rate="5/m", limit=3) == ["redislua.E010"]
    assert policy(rate="5/m", cost=0) == ["redislua.E010"]


def test_e011_methods():
    assert policy(rate="5/m", methods=[1]) == ["redislua.E011"]
    assert policy(rate="5/m", methods=["PO ST"]) == ["redislua.E011"]


def test_e012_headers():
    assert ids(HEADERS="rfc") == ["redislua.E012"]


def test_e013_fail_open():
    assert ids(FAIL_OPEN="yes") == ["redislua.E013"]


def test_e014_trusted_proxies():
    assert ids(TRUSTED_PROXIES=-1) == ["redislua.E014"]


def test_e015_masks():
    assert ids(IPV4_MASK=33) == ["redislua.E015"]
    assert ids(IPV6_MASK=0) == ["redislua.E015"]


def test_e016_key_prefix():
    assert ids(KEY_PREFIX="a{b}") == ["redislua.E016"]
    assert ids(KEY_PREFIX="") == ["redislua.E016"]


def test_e017_middleware_policies():
    assert ids(MIDDLEWARE_POLICIES={"path": "/"}) == ["redislua.E017"]
    assert ids(MIDDLEWARE_POLICIES=[{"path": "/api/"}]) == ["redislua.E017"]
    assert ids(MIDDLEWARE_POLICIES=[{"path": "/api/", "policy": "missing"}]) == ["redislua.E017"]


def test_e018_denied_view():
    assert ids(DENIED_VIEW="tests.nowhere.view") == ["redislua.E018"]
    assert ids(DENIED_VIEW="tests.settings.SECRET_KEY") == ["redislua.E018"]


def test_e028_denied_body():
    for bad in ("json", "Problem", None, True, ["problem"]):
        assert ids(DENIED_BODY=bad) == ["redislua.E028"], bad
    assert ids(DENIED_BODY="text") == [] and ids(DENIED_BODY="problem") == []
    (message,) = check_settings_with(DENIED_BODY="json")
    assert message.hint.startswith('Use "text" (the default: "Too Many Requests") or "problem"')
    assert message.hint.endswith("checks.html#redislua-e028")


def test_e019_timeouts():
    assert ids(SOCKET_TIMEOUT=0) == ["redislua.E019"]
    assert ids(CONNECTION_OPTIONS=[]) == ["redislua.E019"]


def test_e023_lock_claim_window():
    assert ids(LOCK_CLAIM_WINDOW=0) == ["redislua.E023"]
    assert ids(LOCK_CLAIM_WINDOW=61) == ["redislua.E023"]
    assert ids(LOCK_CLAIM_WINDOW="1s") == ["redislua.E023"]
    assert ids(LOCK_CLAIM_WINDOW=True) == ["redislua.E023"]
    assert ids(LOCK_CLAIM_WINDOW=0.25) == []


def test_a_bad_claim_window_leaves_locks_working_on_the_default(settings):
    from django_redislua.conf import settings as redislua_settings
    from django_redislua.locks import Lock

    settings.REDISLUA = {**settings.REDISLUA, "LOCK_CLAIM_WINDOW": "soon"}
    assert redislua_settings.LOCK_CLAIM_WINDOW == 1.0
    with Lock("bad-window", timeout=5) as lock:
        assert lock.owned()


def test_w001_unknown_setting():
    assert ids(POLICY={"p": {}}) == ["redislua.W001"]


def test_w002_unknown_policy_option():
    assert policy(rate="5/m", window=3) == ["redislua.W002"]


def test_docs_list_every_id_with_the_anchor_the_hints_link_to():
    import re
    from pathlib import Path

    import django_redislua

    package = Path(django_redislua.__file__).parent
    used = set()
    for source in package.rglob("*.py"):
        used |= set(re.findall(r"redislua\.[EW]\d{3}", source.read_text()))
    docs = (Path(__file__).resolve().parent.parent / "docs" / "checks.md").read_text()
    anchors = set(re.findall(r"^\((redislua-[ew]\d{3})\)=$", docs, re.MULTILINE))
    assert used and {i.lower().replace(".", "-") for i in used} <= anchors, used


def test_hints_link_to_the_published_entry():
    from django_redislua.links import DOCS_URL

    (message,) = check_settings_with(HEADERS="rfc")
    # The fix first (as Django's own checks do), then the link (issue 27: it was the link alone).
    assert message.hint == ('Use "ietf", "legacy", "both" or None. '
                            f"See {DOCS_URL}checks.html#redislua-e012")


def check_settings_with(**redislua):
    with override_settings(REDISLUA=redislua):
        return check_settings()


def test_e020_drf_throttle_rate():
    rest = {
        "DEFAULT_THROTTLE_CLASSES": ["django_redislua.drf.UserRateThrottle"],
        "DEFAULT_THROTTLE_RATES": {"user": "5/fortnight", "anon": None, "burst": "5/10s"},
    }
    with override_settings(REST_FRAMEWORK=rest, REDISLUA={}):
        assert [m.id for m in check_settings()] == ["redislua.E020"]
    drf_own = {**rest, "DEFAULT_THROTTLE_CLASSES": ["rest_framework.throttling.UserRateThrottle"]}
    with override_settings(REST_FRAMEWORK=drf_own, REDISLUA={}):
        assert check_settings() == []
