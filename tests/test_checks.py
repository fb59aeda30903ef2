"""One test per system check id: `manage.py check` reports each malformed setting by its id.

The checks read settings and code, not Redis (their Redis-reading ones, W006 and I001, are
given a stand-in server): the module is in the unit tier. What a request meets while a mistake
is not fixed is tests/test_config_mistakes.py's.
"""

import os
import subprocess
import sys
import textwrap
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_redislua.checks import check_settings

pytestmark = pytest.mark.unit

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


def test_w007_a_post_key_on_methods_without_a_body():
    # issue 35: a request lacking the field is limited under one shared identity, so every
    # GET of a post:-keyed policy without methods shares one budget
    assert policy(rate="5/m", key="post:username") == ["redislua.W007"]
    assert policy(rate="5/m", key="post:username", methods=["GET", "POST"]) == ["redislua.W007"]
    assert policy(rate="5/m", key="post:username", methods=["POST"]) == []
    assert policy(rate="5/m", key="post:username", methods=["POST", "PUT", "PATCH"]) == []
    assert policy(rate="5/m", key="get:q") == []  # a query string can be on any method
    assert policy(rate="5/m", key="header:x-api-key") == []


def test_e011_normalize_is_a_bool():
    assert policy(rate="5/m", normalize="yes") == ["redislua.E011"]
    assert policy(rate="5/m", normalize=True) == []


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


def test_e019_a_timeout_or_options_the_app_cannot_read_is_reported_not_raised():
    # Issue 36: these raised from check_settings (the connection check reads the facade) and
    # from every request, instead of being reported.
    for bad in ({"SOCKET_TIMEOUT": "soon"}, {"SOCKET_CONNECT_TIMEOUT": []},
                {"CONNECTION_OPTIONS": None}, {"CONNECTION_OPTIONS": "x"}):
        assert ids(CONNECTION="default", **bad) == ["redislua.E019"], bad


def test_e024_use_functions():
    # A string is truthy: "false" would have called every script with FCALL.
    assert ids(USE_FUNCTIONS="false") == ["redislua.E024"]
    assert ids(USE_FUNCTIONS=1) == ["redislua.E024"]
    assert ids(USE_FUNCTIONS=True) == [] and ids(USE_FUNCTIONS=False) == []


def test_e023_lock_claim_window():
    assert ids(LOCK_CLAIM_WINDOW=0) == ["redislua.E023"]
    assert ids(LOCK_CLAIM_WINDOW=61) == ["redislua.E023"]
    assert ids(LOCK_CLAIM_WINDOW="1s") == ["redislua.E023"]
    assert ids(LOCK_CLAIM_WINDOW=True) == ["redislua.E023"]
    assert ids(LOCK_CLAIM_WINDOW=0.25) == []


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
        used |= set(re.findall(r"redislua\.[EWI]\d{3}", source.read_text()))
    docs = (Path(__file__).resolve().parent.parent / "docs" / "checks.md").read_text()
    anchors = set(re.findall(r"^\((redislua-[ewi]\d{3})\)=$", docs, re.MULTILINE))
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


# -- redislua.E029: PolicyThrottle on a view that names no policy -----------------------------
# The views below are this module's URLconf (ROOT_URLCONF="tests.test_checks" in the tests).
from django.urls import include, path  # noqa: E402
from rest_framework import routers, viewsets  # noqa: E402
from rest_framework.decorators import action, api_view, throttle_classes  # noqa: E402
from rest_framework.response import Response  # noqa: E402
from rest_framework.views import APIView  # noqa: E402

from django_redislua import drf  # noqa: E402
from django_redislua.checks import check_views  # noqa: E402


class Misspelled(APIView):
    throttle_classes = [drf.PolicyThrottle]
    throttle_policies = ["api"]  # the mistake: every request passes


class NoPolicyAtAll(APIView):
    throttle_classes = [drf.PolicyThrottle]


class Named(APIView):
    throttle_classes = [drf.PolicyThrottle]
    throttle_policy = "api"


class NoneOnPurpose(Named):
    throttle_policy = None  # a subclass opting out of its base's policy: said, not misspelled


class GlobalDefaults(APIView):
    """No throttle_classes of its own: DEFAULT_THROTTLE_CLASSES, whatever they list."""


class ScopedBeside(APIView):
    throttle_classes = [drf.ScopedRateThrottle, drf.PolicyThrottle]
    throttle_scope = "anon"  # ScopedRateThrottle's, in use: not a guess for the policy


class ExportThrottle(drf.PolicyThrottle):
    policy_attr = "export_policy"


class OwnAttribute(APIView):
    throttle_classes = [ExportThrottle]
    throttle_policy = "export"  # the base class's attribute; this throttle reads export_policy


class OwnAttributeNamed(APIView):
    throttle_classes = [ExportThrottle]
    export_policy = "export"


class PolicyViewSet(viewsets.ViewSet):
    throttle_classes = [drf.PolicyThrottle]
    policy = "api"

    def list(self, request: object) -> Response:
        return Response([])

    def retrieve(self, request: object, pk: str) -> Response:
        return Response({})


class DefaultsViewSet(viewsets.ViewSet):
    def list(self, request: object) -> Response:
        return Response([])

    @action(detail=False, throttle_classes=[drf.PolicyThrottle])
    def unnamed(self, request: object) -> Response:
        return Response({})


class ActionsViewSet(viewsets.ViewSet):
    throttle_policy = None  # as_view() takes only the class's attributes

    def list(self, request: object) -> Response:
        return Response([])

    @action(detail=False, throttle_classes=[drf.PolicyThrottle], throttle_policy="api")
    def named(self, request: object) -> Response:
        return Response({})


@api_view(["GET"])
@throttle_classes([drf.PolicyThrottle])
def function_view(request: object) -> Response:
    return Response({})


@api_view(["GET"])
@throttle_classes([drf.PolicyThrottle])
def function_view_named(request: object) -> Response:
    return Response({})


function_view_named.cls.throttle_policy = "api"  # type: ignore[attr-defined]

router = routers.SimpleRouter()
router.register("things", PolicyViewSet, basename="things")
router.register("others", DefaultsViewSet, basename="others")
router.register("actions", ActionsViewSet, basename="actions")
urlpatterns = [
    path("misspelled/", Misspelled.as_view()),
    path("none/", NoPolicyAtAll.as_view()),
    path("named/", Named.as_view()),
    path("by-initkwargs/", NoneOnPurpose.as_view(throttle_policy="api")),
    path("none-on-purpose/", NoneOnPurpose.as_view()),
    path("defaults/", GlobalDefaults.as_view()),
    path("scoped/", ScopedBeside.as_view()),
    path("own-attribute/", OwnAttribute.as_view()),
    path("own-attribute-named/", OwnAttributeNamed.as_view()),
    path("function/", function_view),
    path("function-named/", function_view_named),
    path("api/", include(router.urls)),
]
HERE = override_settings(ROOT_URLCONF="tests.test_checks")


def e029() -> dict[str, tuple[str, str]]:
    """The E029 messages by the view's dotted path: (message, hint)."""
    with HERE:
        found = [m for m in check_views() if m.id == "redislua.E029"]
    views = {m.msg.split(" on ", 1)[1].split(" at ", 1)[0]: (m.msg, m.hint) for m in found}
    assert len(views) == len(found), [m.msg for m in found]  # one message per view
    return views


def test_e029_policy_throttle_on_a_view_that_names_no_policy():
    found = e029()
    here = "tests.test_checks"
    assert sorted(found) == sorted(f"{here}.{name}" for name in (
        "Misspelled", "NoPolicyAtAll", "ScopedBeside", "OwnAttribute", "PolicyViewSet",
        "DefaultsViewSet", "function_view"))
    message, hint = found[f"{here}.Misspelled"]
    assert message == (
        f"PolicyThrottle on {here}.Misspelled at 'misspelled/' names no policy: the view has "
        "no 'throttle_policy' attribute, so every request passes, unthrottled. Did you mean "
        "throttle_policy (the view has throttle_policies)?")
    assert hint.startswith('Name the policy on the view: throttle_policy = "api"')
    assert hint.endswith("checks.html#redislua-e029")
    assert "Did you mean" not in found[f"{here}.NoPolicyAtAll"][0]
    assert "Did you mean" not in found[f"{here}.ScopedBeside"][0]  # throttle_scope is in use
    assert "(the view has policy)?" in found[f"{here}.PolicyViewSet"][0]
    assert "'api/' at" not in found[f"{here}.PolicyViewSet"][0]  # one line for both routes
    # The @action's own throttle_classes (router initkwargs): the view with the unnamed one.
    assert "at 'api/^others/unnamed/$'" in found[f"{here}.DefaultsViewSet"][0]
    # The subclass's own attribute, and the attribute the view set instead.
    message, hint = found[f"{here}.OwnAttribute"]
    assert message.startswith(f"ExportThrottle on {here}.OwnAttribute at 'own-attribute/'")
    assert "no 'export_policy' attribute" in message
    assert "Did you mean export_policy (the view has throttle_policy)?" in message
    assert hint.startswith('Name the policy on the view: export_policy = "api"')
    assert "or take ExportThrottle out of its throttle_classes" in hint
    # @api_view: the function's dotted path, and how to set the attribute on it.
    message, hint = found[f"{here}.function_view"]
    assert "at 'function/'" in message
    assert 'On an @api_view function, set it after the decorators: function_view.cls.' \
           'throttle_policy = "api".' in hint


def test_e029_fails_manage_py_check():
    with HERE, pytest.raises(SystemCheckError, match=r"redislua\.E029") as failure:
        call_command("check", stdout=StringIO(), stderr=StringIO())
    assert "tests.test_checks.Misspelled at 'misspelled/' names no policy" in str(failure.value)


PROJECT = {
    "manage.py": """
        import os
        import sys

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
        from django.core.management import execute_from_command_line

        execute_from_command_line(sys.argv)
    """,
    "shop/__init__.py": "",
    "shop/settings.py": """
        SECRET_KEY = "tests-only"
        INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth",
                          "rest_framework", "django_redislua", "shop"]
        ROOT_URLCONF = "shop.urls"
        DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
        REDISLUA = {"CONNECTION": "redis://127.0.0.1:6379/0",
                    "POLICIES": {"api": {"rate": "100/m", "key": "user_or_ip"}}}
        REST_FRAMEWORK = {"DEFAULT_THROTTLE_CLASSES": ["django_redislua.drf.PolicyThrottle"]}
    """,
    "shop/views.py": """
        from rest_framework.views import APIView

        from django_redislua.drf import PolicyThrottle


        class Catalog(APIView):  # the global PolicyThrottle, with a policy
            throttle_policy = "api"


        class Health(APIView):  # the global PolicyThrottle, no policy: not limited, no check
            pass


        class Orders(APIView):
            throttle_classes = [PolicyThrottle]
            throttle_policies = ["api"]
    """,
    "shop/urls.py": """
        from django.urls import path

        from shop import views

        urlpatterns = [
            path("catalog/", views.Catalog.as_view()),
            path("health/", views.Health.as_view()),
            path("orders/", views.Orders.as_view()),
        ]
    """,
}


def test_e029_in_manage_py_check_of_a_project(tmp_path: Path) -> None:
    """A project's own ``manage.py check`` in a process of its own: PolicyThrottle as DRF's
    global default leaves a view without a policy alone (it is not limited, as DRF's
    ScopedRateThrottle leaves a view without throttle_scope); the view listing it in its own
    throttle_classes with a misspelled attribute fails the check."""
    for name, text in PROJECT.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text).lstrip())
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DJANGO_", "PYTEST_")) and k != "REDIS_URL"}
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "shop.views.Orders at 'orders/' names no policy" in result.stderr
    assert "Did you mean throttle_policy (the view has throttle_policies)?" in result.stderr
    assert "(redislua.E029)" in result.stderr
    assert "identified 1 issue" in result.stderr  # not Health, not Catalog
