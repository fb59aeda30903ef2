"""tests/testapp/login_views.py deployed under gunicorn (tests/test_request_values.py): the
test project as deployed (tests/deploy_settings.py: REDISLUA_CONNECTION and REDIS_URL from the
environment), with the login views' URLconf, policies and middleware.

Patient Redis timeouts and FAIL_OPEN off: the test counts which attempts are limited, it is
not about timeouts, and with the production 0.5 s a reply a loaded machine delayed would
admit an attempt undecided (as tests/http_load_settings.py says). A failure is a 503 here."""

from tests.deploy_settings import *  # noqa: F403
from tests.deploy_settings import MIDDLEWARE, REDISLUA
from tests.patience import VERY_PATIENT
from tests.testapp.login_policies import MIDDLEWARE_POLICIES, POLICIES

ROOT_URLCONF = "tests.testapp.login_views"
MIDDLEWARE = [*MIDDLEWARE, "django_redislua.middleware.RateLimitMiddleware"]
REDISLUA["POLICIES"] = {**REDISLUA["POLICIES"], **POLICIES}
REDISLUA["MIDDLEWARE_POLICIES"] = MIDDLEWARE_POLICIES
REDISLUA.update(VERY_PATIENT)
REDISLUA["FAIL_OPEN"] = False
