"""This app's DRF throttles as ``REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"]``, in a real start-up.

DRF reads the global throttle classes (and so imports ``django_redislua.drf``) while
``rest_framework.views`` is still defining APIView. Whatever imports DRF first, and in whatever
order the apps are listed, a fresh interpreter must start, pass ``check`` and throttle a view
that names no throttle of its own: 200, 200, 200, 429 on a 3/h anonymous rate, each response
with the RateLimit header, the counts in Redis under the run's own key prefix.

Each case is a new Python process, so import order is the real one, not the test suite's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import redis
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 60

SCRIPT = textwrap.dedent(
    """
    import sys

    import django
    from django.apps import AppConfig
    from django.conf import settings

    mode, redis_url, prefix = sys.argv[1:4]


    class ImportsDRFWhenReady(AppConfig):
        \"\"\"Another project app: its ready() imports DRF's views before rest_framework's
        own ready() runs (it is listed before rest_framework).\"\"\"

        name = "tests"  # any importable package without models
        label = "imports_drf_when_ready"

        def ready(self):
            import rest_framework.generics
            import rest_framework.views  # noqa: F401


    if mode != "settings-module":
        if mode == "app-ready-imports-drf":
            apps = ["django_redislua", "__main__.ImportsDRFWhenReady", "rest_framework"]
        else:
            apps = ["rest_framework", "django_redislua"]
        settings.configure(
            SECRET_KEY="tests-only",
            DEBUG=False,
            USE_TZ=True,
            ALLOWED_HOSTS=["testserver"],
            ROOT_URLCONF="tests.testapp.drf_startup_urls",
            INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", *apps],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            REDISLUA={"CONNECTION": redis_url, "KEY_PREFIX": prefix},
            REST_FRAMEWORK={
                "DEFAULT_THROTTLE_CLASSES": [
                    "django_redislua.drf.AnonRateThrottle",
                    "django_redislua.drf.UserRateThrottle",
                ],
                "DEFAULT_THROTTLE_RATES": {"anon": "3/h", "user": "10/h"},
            },
        )
        if mode == "drf-imported-first":  # e.g. by a module the settings import
            import rest_framework.views  # noqa: F401

    django.setup()

    from django.core.management import call_command
    from django.test import Client

    call_command("check")  # raises SystemCheckError on any error
    from tests.testapp.drf_startup_urls import GloballyThrottled

    classes = GloballyThrottled.throttle_classes  # DRF's global default, read at import
    print("THROTTLES", *(f"{c.__module__}.{c.__name__}" for c in classes))
    client = Client()
    for _ in range(4):
        response = client.get("/throttled/")
        print("GET", response.status_code, "RateLimit" in response, response.get("Retry-After"))
    """
)


def environment(prefix: str, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "REDIS_URL": settings.REDIS_URL,
        "PYTHONPATH": str(ROOT),
        "REDISLUA_KEY_PREFIX": prefix,
    }
    env.pop("PYTHONWARNINGS", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.update(extra)
    return env


@pytest.mark.parametrize(
    "mode", ["plain", "drf-imported-first", "app-ready-imports-drf", "settings-module"]
)
def test_global_throttle_classes_at_start_up(mode: str, r: redis.Redis) -> None:
    prefix = f"drf-startup-{uuid.uuid4().hex}"
    extra = {"DJANGO_SETTINGS_MODULE": "tests.drf_startup_settings"}
    env = environment(prefix, **(extra if mode == "settings-module" else {}))
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, settings.REDIS_URL, prefix],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "System check identified no issues (0 silenced)." in lines, result.stdout
    assert [line for line in lines if line.startswith("THROTTLES")] == [
        "THROTTLES django_redislua.drf.AnonRateThrottle django_redislua.drf.UserRateThrottle"
    ]
    gets = [line.split()[1:] for line in lines if line.startswith("GET")]
    assert [status for status, _, _ in gets] == ["200", "200", "200", "429"], result.stdout
    assert [header for _, header, _ in gets] == ["True"] * 4, result.stdout
    assert int(gets[3][2]) > 3000  # Retry-After: the first of 3 requests an hour ages out
    # The counts are in the suite's Redis, under this run's prefix: the app's throttles decided.
    assert list(r.scan_iter(match=f"{prefix}:*", count=1000))


def test_manage_py_check_with_the_global_throttle_classes() -> None:
    """``python -m django check`` (what ``manage.py check`` runs) with a settings module."""
    env = environment(
        f"drf-startup-{uuid.uuid4().hex}", DJANGO_SETTINGS_MODULE="tests.drf_startup_settings"
    )
    result = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "System check identified no issues" in result.stdout, result.stdout + result.stderr
