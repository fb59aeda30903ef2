"""Real HTTP against real processes: the example project under gunicorn (4 sync workers) and
under uvicorn workers (the async view), 50 client threads firing 200 requests at a 5/m view.

Exactly 5 may succeed, whichever worker and thread they land on: the count lives in Redis
and each decision is one atomic script call (a run spanning two of the sliding window's
aligned minutes: each admission counted exactly once, at most 5 per window).
"""

from __future__ import annotations

import http.client
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from django.conf import settings

from django_redislua.testing import free_port
from tests.processes import stop_group

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "example_project"
CLIENTS, REQUESTS = 50, 200
BOOT_TIMEOUT, LOAD_TIMEOUT = 40.0, 60.0


def server_command(kind: str, port: int) -> list[str]:
    bind = f"127.0.0.1:{port}"
    if kind == "gunicorn":
        return [sys.executable, "-m", "gunicorn", "--workers", "4", "--bind", bind,
                "--chdir", str(EXAMPLE), "demo.wsgi:application"]
    if importlib.util.find_spec("uvicorn.workers") is not None:
        return [sys.executable, "-m", "gunicorn", "--workers", "4", "--bind", bind,
                "--chdir", str(EXAMPLE), "-k", "uvicorn.workers.UvicornWorker",
                "demo.asgi:application"]
    return [sys.executable, "-m", "uvicorn", "--workers", "4", "--host", "127.0.0.1",
            "--port", str(port), "--app-dir", str(EXAMPLE), "demo.asgi:application"]


def get(port: int, path: str, timeout: float = 10.0) -> tuple[int, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


@contextmanager
def serving(kind: str) -> Iterator[int]:
    port = free_port()
    # The example project, with patient timeouts and FAIL_OPEN off (tests/http_load_settings.py).
    env = {**os.environ, "REDIS_URL": settings.REDIS_URL,
           "DJANGO_SETTINGS_MODULE": "tests.http_load_settings",
           "PYTHONPATH": os.pathsep.join([str(EXAMPLE), str(ROOT)])}
    env.pop("PYTHONWARNINGS", None)
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            server_command(kind, port), cwd=EXAMPLE, env=env, stdout=log, stderr=log,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + BOOT_TIMEOUT
            while True:
                try:
                    if get(port, "/", timeout=2)[0] == 200:
                        break
                except OSError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"{kind} did not start:\n{log.read().decode()[-3000:]}")
                time.sleep(0.2)
            yield port
        finally:
            stop_group(process)


def window_counts(policy: str) -> tuple[int, int]:
    """The previous and current window counts Redis holds for 127.0.0.1 under the demo's
    sliding_window ``policy`` (its decimal form: the window's start in ms, then the current
    and the previous count, three digits each)."""
    state = redis.Redis.from_url(settings.REDIS_URL).get(f"rl:{policy}:sw:{{127.0.0.1}}")
    assert state is not None and len(state) == 19, state
    return int(state[16:]), int(state[13:16])


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "path"), [("gunicorn", "/limited/"), ("uvicorn", "/async/")])
def test_exactly_five_of_two_hundred(kind: str, path: str) -> None:
    with serving(kind) as port:
        started = time.monotonic()
        with ThreadPoolExecutor(CLIENTS) as pool:
            futures = [pool.submit(get, port, path) for _ in range(REQUESTS)]
            done, not_done = wait(futures, timeout=LOAD_TIMEOUT)
        elapsed = time.monotonic() - started
    assert not not_done, f"{len(not_done)} requests did not finish within {LOAD_TIMEOUT}s"
    results = [f.result() for f in done]
    statuses = Counter(status for status, _ in results)
    # The policy is a sliding window (5 a minute), whose windows are aligned to the minute. A
    # run that outlasts the minute it started in by a fifth of it (a loaded machine) may be
    # admitted more in the next window, as the algorithm says: every admission is then
    # counted in Redis exactly once, and no window holds more than 5.
    previous, current = window_counts("demo" if path == "/limited/" else "async-demo")
    assert previous + current == statuses[200] and previous <= 5 and current <= 5, (
        previous, current, statuses)
    if previous == 0:  # one window
        assert statuses == {200: 5, 429: 195}, statuses
    for status, headers in results:
        if status == 429:
            assert int(headers["retry-after"]) >= 1
            assert ";r=0;" in headers["ratelimit"]
    print(f"{kind}: {REQUESTS} requests, {CLIENTS} threads, {elapsed:.2f}s: {dict(statuses)}")
