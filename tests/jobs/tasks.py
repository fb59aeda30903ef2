"""Django tasks for tests/test_jobs_tasks.py, run by django-tasks-db's ``db_worker``.

``limit_key`` is also where the time just before each admission is noted: the key is asked
for right before the policies decide, so "at most 3 starts in any 2 s" is checked between
bounds no scheduling delay can break (as the Celery test does with ``before_start``).
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


@limited_task(singleton=True, singleton_timeout="10s")
def nightly(n: int, calls: int) -> int:
    """Holds its singleton until every other one of ``calls`` runs has finished (at most 30 s):
    each was turned away while this one held it, and described it (who holds the lock is read
    after the refusal, so a holder gone by then would be "its lease has just ended")."""
    from django_tasks_db.models import DBTaskResult

    note("tasks-nightly", n, os.getpid())
    others = DBTaskResult.objects.filter(task_path__endswith=".nightly").finished()
    deadline = time.monotonic() + 30
    while others.count() < calls - 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return n
