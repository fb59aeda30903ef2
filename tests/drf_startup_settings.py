"""Settings for tests/test_drf_startup.py's ``manage.py``-style subprocesses: this app's DRF
throttles as the global default, in a settings module as a project writes them.

It does not import tests.settings (which starts a Redis server when REDIS_URL is unset): the
server is ``REDIS_URL`` from the environment, the key prefix ``REDISLUA_KEY_PREFIX``.
"""

import os

try:
    REDIS_URL = os.environ["REDIS_URL"]
except KeyError:
    raise RuntimeError("tests.drf_startup_settings needs REDIS_URL in the environment") from None

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["testserver"]
ROOT_URLCONF = "tests.testapp.drf_startup_urls"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "rest_framework",
    "django_redislua",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
REDISLUA = {
    "CONNECTION": REDIS_URL,
    "KEY_PREFIX": os.environ.get("REDISLUA_KEY_PREFIX", "drf-startup"),
}
REST_FRAMEWORK = {
    "DEFAULT_THROTTLE_CLASSES": [
        "django_redislua.drf.AnonRateThrottle",
        "django_redislua.drf.UserRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {"anon": "3/h", "user": "10/h"},
}
