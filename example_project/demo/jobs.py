"""The /jobs/ page: send Celery tasks to the worker ``manage.py demo`` runs, watch their states.

Twelve partner calls under 5 per 10 s: five run at once, the others show RATE_LIMITED until
their turn (put off, never dropped). Two nightly syncs at once: one runs, one is SKIPPED.
"""

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

# The task ids this page sent, newest first (in the demo's Redis: every process sees them).
SENT = "demo:jobs:sent"


def _celery() -> Any:
    """The demo's Celery app and tasks, or None when Celery is not installed."""
    try:
        from demo import tasks
        from demo.celery import app
    except ImportError:
        return None
    return app, tasks


def jobs(request: HttpRequest) -> HttpResponse:
    from django_redislua.connection import get_client

    found = _celery()
    if found is None:
        return render(request, "demo/jobs.html", {"missing": True})
    app, tasks = found
    client = get_client()
    message = ""
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "partner":
            sent = [tasks.call_partner.delay(n).id for n in range(1, 13)]
            message = "Sent 12 partner calls."
        else:
            sent = [tasks.nightly_sync.delay().id for _ in range(2)]
            message = "Sent the nightly sync twice."
        client.lpush(SENT, *[f"{action}:{task_id}" for task_id in sent])
        client.ltrim(SENT, 0, 49)
    rows = []
    for entry in client.lrange(SENT, 0, 49):
        kind, task_id = entry.decode().split(":", 1)
        result = app.AsyncResult(task_id)
        info = result.info
        if isinstance(info, dict):  # RATE_LIMITED's and SKIPPED's meta, STARTED's worker
            info = "; ".join(f"{name}: {value}" for name, value in info.items())
        rows.append({"kind": kind, "id": task_id, "state": result.state,
                     "detail": info if isinstance(info, str) else ""})
    return render(request, "demo/jobs.html", {"rows": rows, "message": message})
