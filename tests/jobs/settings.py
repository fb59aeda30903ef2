"""The test settings plus what the job tests' workers limit by (REDIS_URL: the parent's
server, inherited)."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS, REDISLUA

REDISLUA = {
    **REDISLUA,
    "POLICIES": {
        **REDISLUA["POLICIES"],
        # docs/jobs.md's example: a partner API allowing 5 calls per 10 s across every worker.
        "partner-api": {"algorithm": "sliding_log", "rate": "5/10s"},
        "exports": {"algorithm": "concurrency", "limit": 2, "timeout": "1m"},
        "tasks-api": {"algorithm": "sliding_log", "rate": "3/2s"},
        "hourly": {"algorithm": "fixed_window", "rate": "1/h"},
    },
}
INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db"]
try:  # Django 6 has django.tasks; before it, the backport's own app
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")
# Django's tasks: one file database the enqueuing process and the db_worker processes share.
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.environ.get("JOBS_DATABASE", ":memory:")}}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
