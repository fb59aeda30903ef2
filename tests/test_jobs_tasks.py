"""Django's tasks limited across real workers (docs/jobs.md): django-tasks-db's ``db_worker``,
two of them, in processes of their own, on one SQLite file; the enqueuing process is another.
On Django 5.2 through the ``django-tasks`` backport, on Django 6 through ``django.tasks``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django_tasks_db", reason="django-tasks-db runs Django's tasks in a worker "
                                              "(pip install django-tasks-db)")

from tests.processes import stop_group

ROOT = Path(__file__).resolve().parent.parent

# Enqueues, then follows each task to its end: a denied run's return value names the task
# result that runs it later ("rescheduled_as").
CLIENT = textwrap.dedent("""
    import json, sys, time
    import django
    django.setup()
    from tests.jobs import tasks

    task = getattr(tasks, sys.argv[1])
    calls = json.loads(sys.argv[2])
    results = [task.enqueue(*args) for args in calls]
    ends = []
    deadline = time.monotonic() + 90
    for result in results:
        chain = [result.id]
        while True:
            result = task.get_result(chain[-1])
            if result.is_finished:
                value = result.return_value
                if isinstance(value, dict) and value.get("redislua") == "rate_limited":
                    chain.append(value["rescheduled_as"])
                    continue
                ends.append({"status": str(result.status), "value": value, "runs": len(chain)})
                break
            assert time.monotonic() < deadline, chain
            time.sleep(0.05)
    print(json.dumps(ends))
""")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.jobs.settings",
           "JOBS_DATABASE": str(tmp_path / "tasks.sqlite3"), "JOBS_BROKER_URL": "unused"}
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0"], cwd=ROOT, env=env,
                   check=True, timeout=120)
    return env


@pytest.fixture
def workers(env: dict[str, str], tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started = [subprocess.Popen(
        [sys.executable, "-m", "django", "db_worker", "--interval", "0.05",
         "--no-startup-delay", "--worker-id", f"w{i}"],
        cwd=ROOT, env=env, stdout=(tmp_path / f"worker{i}.log").open("wb"),
        stderr=subprocess.STDOUT, start_new_session=True) for i in range(2)]
    try:
        yield started
    finally:
        for process in started:
            stop_group(process)


def client(env: dict[str, str], task: str, calls: list[list[Any]]) -> list[dict[str, Any]]:
    done = subprocess.run([sys.executable, "-c", CLIENT, task, json.dumps(calls)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


def notes(r: Any, kind: str) -> list[list[str]]:
    return [entry.decode().split() for entry in r.lrange(f"jobs:{kind}", 0, -1)]


def test_9_tasks_under_3_per_2s_all_run_once_never_4_in_2s(
        env: dict[str, str], workers: Any, r: Any) -> None:
    ends = client(env, "call_partner", [[n] for n in range(9)])
    assert sorted(end["value"] for end in ends) == list(range(9))
    assert {end["status"] for end in ends} == {"SUCCESSFUL"}
    assert max(end["runs"] for end in ends) > 1, "some were put off, then ran"
    starts = notes(r, "tasks-partner")
    assert sorted(int(n) for n, _ in starts) == list(range(9)), "each ran exactly once"
    # The admission of each run happened after its "asked" note and before its start.
    asked: dict[str, list[float]] = {}
    for n, at in notes(r, "tasks-asked"):
        asked.setdefault(n, []).append(float(at))
    bounds = sorted((float(at), max(a for a in asked[n] if a <= float(at)))
                    for n, at in starts)
    for window in range(len(bounds) - 3):
        four = bounds[window:window + 4]
        assert four[-1][0] - min(a for _started, a in four) >= 2, four


def test_a_singleton_task_enqueued_3_times_at_once_runs_once(
        env: dict[str, str], workers: Any, r: Any) -> None:
    ends = client(env, "nightly", [[n, 3] for n in range(3)])
    values = [end["value"] for end in ends]
    ran = [v for v in values if isinstance(v, int)]
    skipped = [v for v in values if isinstance(v, dict)]
    # The one that ran held the lock until the other two had ended: both were skipped.
    assert len(ran) == 1 and len(notes(r, "tasks-nightly")) == 1, values
    assert len(skipped) == 2 and all(
        v["redislua"] == "skipped" and "fencing token" in v["held_by"] for v in skipped), values


def test_the_checks_say_when_a_limited_tasks_backend_cannot_put_it_off(r: Any) -> None:
    from django.test import override_settings

    from django_redislua.checks import check_settings
    from django_redislua.jobs import tasks
    from django_redislua.jobs.tasks import limited_task

    package = "django.tasks" if importlib.util.find_spec("django.tasks") else "django_tasks"
    backends = f"{package}.backends"
    # Its setting_changed receiver (the suite's settings do not install the backport's app,
    # whose ready() imports it): override_settings(TASKS=...) then takes effect.
    importlib.import_module(f"{package}.signals")
    from tests.jobs import check_tasks

    try:
        with override_settings(TASKS={
                "default": {"BACKEND": f"{backends}.immediate.ImmediateBackend"}}):
            made = limited_task(policies=["api"])(check_tasks.notify_partner)
            assert [(m.id, m.msg) for m in check_settings()] == [(
                "redislua.E032", "Job 'tests.jobs.check_tasks.notify_partner': its task backend "
                "ImmediateBackend cannot run a task later (run_after), so a run its policies "
                "deny could not be put off.")]
            backend = {"default": {"BACKEND": f"{backends}.dummy.DummyBackend"}}
            with override_settings(TASKS=backend):
                assert check_settings() == []
    finally:
        # Django keeps the task's function (an lru_cache of signatures): the task outlives
        # the test, but with its module unloaded the checks pass over it.
        del sys.modules["tests.jobs.check_tasks"]
    assert all(task is not made for task, _gate in tasks.limited_tasks())
