"""Django tasks for tests/test_jobs_tasks.py, run by django-tasks-db's ``db_worker``.

``limit_key`` is also where the time just before each admission is noted: the key is asked
for right before the policies decide, so "at most 3 starts in any 2 s" is checked between
bounds no scheduling delay can break (as the Celery test does with ``before_start``). The
``singleton`` callable counts the runs that asked for the lock, the same way.
"""

from __future__ import annotations

import os
import time

from django_redislua.connection import get_client
from django_redislua.jobs.tasks import limited_task


def note(kind: str, *values: object) -> None:
    get_client().rpush(f"jobs:{kind}", " ".join(str(v) for v in values))


def asked(n: int) -> str:
    note("tasks-asked", n, time.time())
    return "partner"


@limited_task(policies=["tasks-api"], limit_key=asked)
def call_partner(n: int) -> int:
    note("tasks-partner", n, time.time())
    return n


def lock_asked(n: int, calls: int) -> str:
    get_client().incr("jobs:tasks-lock-asked")
    return "tasks-nightly"


@limited_task(singleton=lock_asked, singleton_timeout="10s")
def nightly(n: int, calls: int) -> int:
    """Holds its singleton until every one of ``calls`` runs has asked for it (at most 30 s):
    then each other one was turned away while this one held it."""
    note("tasks-nightly", n, os.getpid())
    deadline = time.monotonic() + 30
    while int(get_client().get("jobs:tasks-lock-asked") or 0) < calls:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return n
