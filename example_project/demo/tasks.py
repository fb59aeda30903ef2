"""Background jobs of the demo (docs/jobs.md): a partner API limited across every worker, and a
nightly sync that runs on one worker at a time. The /jobs/ page sends them."""

import os
import time
from datetime import UTC, datetime

from celery import shared_task

from django_redislua.jobs.celery import RedisluaTask


@shared_task(base=RedisluaTask, policies=["partner-api"])
def call_partner(order_id: int) -> str:
    """5 calls per 10 s across every worker: the others are put off (RATE_LIMITED), not lost."""
    return f"order {order_id} sent at {datetime.now(UTC):%H:%M:%S} UTC by process {os.getpid()}"


@shared_task(base=RedisluaTask, singleton=True, singleton_timeout="30s")
def nightly_sync() -> str:
    """At most one runs at a time anywhere: a second sent meanwhile is SKIPPED."""
    time.sleep(5)
    return f"synced at {datetime.now(UTC):%H:%M:%S} UTC"
