"""Settings for the test suite. Redis is REDIS_URL, else a server this process starts."""

from django_redislua.testing import shared_server_url
from tests.patience import PATIENT

REDIS_URL = shared_server_url()

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.urls"
STATIC_URL = "/static/"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",  # the admin's CSS and JS, served by pytest-django's live_server
    "rest_framework",
    "django_redislua",
    "tests.testapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
# Django's advice for tests: a test user's password is hashed in microseconds, not the 0.5 s of
# CPU PBKDF2's iterations take here (0.5 s of every admin test, measured). No test is about
# the hasher; the logins, their forms and their limits are the same.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL},
    "django_redis": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS_URL},
    "locmem": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
}
# Patient Redis timeouts (tests/patience.py); tests of timeout behaviour set short ones.
REDISLUA = {
    "CONNECTION": REDIS_URL,
    **PATIENT,
    "POLICIES": {
        "login": {"algorithm": "sliding_log", "rate": "5/m", "key": "ip", "methods": ["POST"]},
        "api": {"algorithm": "gcra", "rate": "100/m", "burst": 20, "key": "user_or_ip"},
        "search": {"algorithm": "token_bucket", "rate": "10/s", "burst": 50, "key": "user_or_ip"},
        "export": {"algorithm": "concurrency", "limit": 2, "key": "user", "timeout": "10m"},
    },
}
# As README and docs/drf.md tell users: this app's throttles as DRF's global default. The rates
# are high so tests that do not count throttled requests are not disturbed; tests override them.
REST_FRAMEWORK = {
    "DEFAULT_THROTTLE_CLASSES": [
        "django_redislua.drf.AnonRateThrottle",
        "django_redislua.drf.UserRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {"anon": "1000/m", "user": "1000/m"},
}
