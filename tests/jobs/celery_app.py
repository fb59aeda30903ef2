"""The Celery app the job tests' workers run (``celery -A tests.jobs.celery_app worker``).

Each task writes what it did to Redis (lists under ``jobs:``), where the test reads it: the
start of each run with the instant just before its admission was asked (``before_start``), so
"at most 5 starts in any 10 s" is checked between bounds no scheduling delay can break.
"""

from __future__ import annotations

import os
import time
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.jobs.settings")
django.setup()

from celery import Celery  # noqa: E402

from django_redislua.connection import get_client  # noqa: E402
from django_redislua.jobs.celery import RedisluaTask  # noqa: E402

app = Celery("jobs", broker=os.environ["JOBS_BROKER_URL"], backend=os.environ["JOBS_BROKER_URL"])
app.conf.update(
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_track_started=True,
)


class Timed(RedisluaTask):
    """RedisluaTask, noting when each delivery began (before its admission is asked)."""

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        self.request.asked_at = time.time()


def note(kind: str, *values: object) -> None:
    get_client().rpush(f"jobs:{kind}", " ".join(str(v) for v in values))


@app.task(base=Timed, bind=True, policies=["partner-api"])
def call_partner(self: Timed, n: int) -> int:
    started = time.time()  # called outside a worker: no before_start
    note("partner", n, getattr(self.request, "asked_at", started), started, self.request.retries)
    return n


@app.task(base=RedisluaTask, singleton=True, singleton_timeout="3s")
def nightly(n: int, seconds: float) -> int:
    note("nightly", n, os.getpid(), time.time())
    time.sleep(seconds)
    return n


@app.task(base=RedisluaTask, singleton="catalog", singleton_timeout="10s", singleton_rerun=True)
def sync_catalog(n: int, hold: bool) -> int:
    """With ``hold``, keeps the singleton until a run turned away by it has left its rerun
    request (at most 30 s)."""
    note("catalog", n, "start", time.time())
    deadline = time.monotonic() + 30
    while hold and not get_client().exists("rl:lock:{catalog}:rerun"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    note("catalog", n, "end", time.time())
    return n


# A lease of 10 s: the killed delivery comes back 0.2-4 s after the kill (measured), always
# while the dead process's lease still holds, so the test sees the path it is about.
@app.task(base=RedisluaTask, bind=True, singleton=True, singleton_timeout="10s", acks_late=True,
          reject_on_worker_lost=True)
def nightly_late(self: RedisluaTask, n: int) -> int:
    """Acked when done; a delivery whose process dies comes back. The first run takes a minute
    (the test kills it), any later one none."""
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    note("late", n, os.getpid(), redelivered, time.time())
    if get_client().incr("jobs:late-runs") == 1:
        time.sleep(60)
    return n


@app.task(base=RedisluaTask, policies="hourly", limit_max_wait="2s")
def hourly_report(n: int) -> int:
    note("hourly", n)
    return n


@app.task(base=RedisluaTask, policies="exports")
def export(n: int) -> int:
    client = get_client()
    running = client.incr("jobs:running")
    note("export-running", running)
    time.sleep(0.5)
    client.decr("jobs:running")
    note("export", n)
    return n
