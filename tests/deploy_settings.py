"""The test project as deployed under gunicorn (tests/test_deploy_cluster_down.py).

Everything of tests.settings, then from the environment: ``REDISLUA_CONNECTION`` (required)
and ``REDISLUA_FAIL_OPEN`` ("1", the default, or "0"). Pass ``REDIS_URL`` too, or importing
tests.settings starts a Redis server of its own.

Errors of ``django`` (a 5xx it logs) and warnings of ``django_redislua`` (an outage) go to
stderr, one line each with the level, logger and process id, so a test can count them in the
server's log. (Without this, DEBUG = False leaves Django's errors to mail_admins only.)
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import REDISLUA

REDISLUA["CONNECTION"] = os.environ["REDISLUA_CONNECTION"]
REDISLUA["FAIL_OPEN"] = os.environ.get("REDISLUA_FAIL_OPEN", "1") == "1"
DEBUG = False

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "line": {"format": "%(levelname)s %(name)s pid=%(process)d %(message)s"},
    },
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "formatter": "line", "level": "WARNING"},
    },
    "loggers": {
        "django": {"handlers": ["stderr"], "level": "ERROR", "propagate": False},
        "django_redislua": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
    },
}
