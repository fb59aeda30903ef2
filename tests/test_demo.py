"""The example project (``python3 dev.py demo``) as a visitor and its operator meet it (issue 35):
README's quickstart URL answers, the async view has a budget of its own, and Ctrl-C stops the
demo (and dev.py around it) without a traceback, its embedded Redis with it."""

from __future__ import annotations

import http.client
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from django_redislua.testing import free_port
from tests.processes import stop_group

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "example_project"
BOOT_TIMEOUT = 60.0

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The demo's URLs, templates and policies, on the suite's Redis."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from demo import settings as demo_settings

    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "demo"]
    settings.ROOT_URLCONF = "demo.urls"
    settings.REDISLUA = {**settings.REDISLUA, **{
        name: demo_settings.REDISLUA[name] for name in ("POLICIES", "PLANS", "PLAN")}}
    settings.CELERY_BROKER_URL = settings.CELERY_RESULT_BACKEND = settings.REDIS_URL
    loaded = set(sys.modules)
    yield demo_settings
    # The demo's jobs name its policies: unloaded, the system checks of later tests (on the
    # suite's settings) pass over them.
    for name in set(sys.modules) - loaded:
        if name.startswith("demo."):
            del sys.modules[name]


def test_the_readme_quickstart_url_is_served_as_the_readme_says(demo: Any) -> None:
    client = Client()
    responses = [client.get("/hello/") for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert responses[0].content == b"Hello!\n"
    assert responses[3]["RateLimit-Policy"] == '"hello";q=3;w=60'  # README's headers
    assert responses[3]["RateLimit"].startswith('"hello";r=0;t=')
    assert 'href="/hello/"' in client.get("/").content.decode()


def test_the_async_view_is_not_spent_by_the_limited_pages_reloads(demo: Any) -> None:
    """The index says "reload it six times"; the async view's first visit after that is a 200."""
    client = Client()
    assert [client.get("/limited/").status_code for _ in range(6)] == [200] * 5 + [429]
    allowed = [client.get("/async/") for _ in range(6)]
    assert [r.status_code for r in allowed] == [200] * 5 + [429]  # its own 5 a minute
    assert allowed[0]["RateLimit-Policy"] == '"async-demo";q=5;w=60'


def test_the_quota_endpoints_decide_by_plan_and_show_the_usage(demo: Any) -> None:
    """The index's API quotas: 50 a month on free, counted from the 1st; the usage reads it."""
    client = Client()
    assert 'href="/quota/?plan=free"' in client.get("/").content.decode()
    free = [client.get("/quota/?plan=free") for _ in range(3)]
    assert all(r.status_code == 200 for r in free)
    assert '"quota-monthly";q=50;w=' in free[0]["RateLimit-Policy"]
    pro = client.get("/quota/?plan=pro")
    assert pro.status_code == 200 and '"quota-monthly";q=5000;w=' in pro["RateLimit-Policy"]
    rows = {row["policy"]: row for row in client.get("/quota/usage/?plan=free").json()["usage"]}
    monthly = rows["quota-monthly"]
    assert (monthly["used"], monthly["limit"], monthly["plan"]) == (4, 50, "free")
    assert monthly["period"] == "month" and monthly["timezone"] == "Europe/Paris"
    assert rows["quota-burst"]["used"] == 4  # one identity (the address) on both plans


def test_the_jobs_page_sends_tasks_a_worker_would_limit(demo: Any, r: Any) -> None:
    pytest.importorskip("celery")
    client = Client()
    assert "Send 12 partner calls" in client.get("/jobs/").content.decode()
    page = client.post("/jobs/", {"action": "partner"}).content.decode()
    assert "Sent 12 partner calls." in page
    assert page.count("<td>partner</td>") == 12 and "PENDING" in page  # no worker here
    # The worker's side is tests/test_jobs_celery.py's; the tasks are the ones it runs.
    from demo import tasks

    assert tasks.call_partner.redislua_gate().policy_names == ("partner-api",)
    assert tasks.nightly_sync.redislua_gate().singleton == "demo.tasks.nightly_sync"
    assert 'href="/jobs/"' in client.get("/").content.decode()


def test_the_nightly_report_command_runs_once_a_day(demo: Any) -> None:
    from io import StringIO

    from django.core.management import call_command

    outs = [StringIO(), StringIO()]
    for out in outs:
        call_command("nightly_report", stdout=out)
    assert outs[0].getvalue() == "ran: report sent\n"
    assert outs[1].getvalue().startswith(f"done already today: by {socket.gethostname()[:100]}:")


def test_ctrl_c_while_the_demo_prepares_ends_it_quietly(
        demo: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """An interrupt during migrate (before runserver, which handles its own) is not a
    traceback either."""
    from io import StringIO

    from demo.management.commands import demo as command
    from django.core.management import call_command

    def interrupted(name: str, *args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "call_command", interrupted)
    out = StringIO()
    try:
        call_command("demo", "127.0.0.1:1", stdout=out)  # returns: exit status 0
    except KeyboardInterrupt:
        pytest.fail("the interrupt escaped the demo command: a traceback in a terminal")
    assert out.getvalue() == "Stopped.\n"


def demo_env() -> dict[str, str]:
    """A shell's environment: no suite settings, no REDIS_URL (the demo starts its own)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DJANGO_", "PYTEST_")) and k != "REDIS_URL"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def answers(port: int) -> bool:
    """A whole request and response (the server closes the connection after it). Not a bare
    connect: a Ctrl-C landing while runserver is still starting the thread for a connection
    makes CPython's socketserver close that connection under the thread, which prints an
    "Exception occurred during processing of request" traceback (a race inside Python's
    socketserver, out of the demo's reach; a person's Ctrl-C rarely meets an arriving request)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/", headers={"Connection": "close"})
        response = connection.getresponse()
        response.read()
    except OSError:
        return False
    finally:
        connection.close()
    return response.status == 200


# How dev.py runs the demo (its run(), without installing anything first).
VIA_DEV_PY = ("import sys; sys.path.insert(0, {root!r}); import dev; "
              "sys.exit(dev.run(*sys.argv[1:]))")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["manage.py", "dev.py"])
def test_ctrl_c_stops_the_demo_without_a_traceback(how: str, tmp_path: Path) -> None:
    """Ctrl-C in a terminal signals the whole foreground process group: dev.py, the demo and
    its embedded redis-server. Each must end quietly: exit status 0, no traceback, no Redis left
    running. The project is a copy, so its db.sqlite3 is the test's."""
    project = tmp_path / "example_project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("db.sqlite3", "__pycache__"))
    port = free_port()
    command = [sys.executable, str(project / "manage.py"), "demo", f"127.0.0.1:{port}"]
    if how == "dev.py":
        command = [sys.executable, "-c", VIA_DEV_PY.format(root=str(ROOT)), *command]
    process = subprocess.Popen(command, cwd=tmp_path, env=demo_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + BOOT_TIMEOUT
        while not answers(port):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the demo did not start serving"
            time.sleep(0.2)
        os.killpg(process.pid, signal.SIGINT)  # what the terminal sends on Ctrl-C
        out, err = process.communicate(timeout=30)
    finally:
        stop_group(process)  # only if it did not stop by itself
    assert process.returncode == 0, (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    redis_url = re.search(r"Redis: redis://127\.0\.0\.1:(\d+)/0", out)
    assert redis_url, out
    assert not listening(int(redis_url.group(1)))  # the embedded Redis went with it
    assert not listening(port)
    worker = re.search(r"Celery worker: pid (\d+)", out)
    if importlib.util.find_spec("celery") is None:
        assert worker is None, out  # no Celery, no worker: the demo runs without one
        return
    assert worker, out  # with Celery the demo started its worker
    with pytest.raises(ProcessLookupError):  # and stopped it
        os.kill(int(worker.group(1)), 0)
