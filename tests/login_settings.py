"""tests/testapp/login_views.py deployed under gunicorn (tests/test_request_values.py): the
test project as deployed (tests/deploy_settings.py: REDISLUA_CONNECTION and REDIS_URL from the
environment), with the login views' URLconf, policies and middleware."""

from tests.deploy_settings import *  # noqa: F403
from tests.deploy_settings import MIDDLEWARE, REDISLUA
from tests.testapp.login_policies import MIDDLEWARE_POLICIES, POLICIES

ROOT_URLCONF = "tests.testapp.login_views"
MIDDLEWARE = [*MIDDLEWARE, "django_redislua.middleware.RateLimitMiddleware"]
REDISLUA["POLICIES"] = {**REDISLUA["POLICIES"], **POLICIES}
REDISLUA["MIDDLEWARE_POLICIES"] = MIDDLEWARE_POLICIES
