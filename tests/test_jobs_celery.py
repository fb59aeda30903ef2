"""Celery tasks limited across real workers (docs/jobs.md): prefork, 2 workers x 2 processes, a
Redis broker, started for this module and stopped after it (a pool process a test SIGKILLs is
replaced by its worker).

The broker and result backend live on a server of their own (the suite flushes its data server
before every test; a broker's bindings must not go with it). The workers decide on the suite's
server, whose URL they inherit (tests/jobs/settings.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("celery", reason="Celery is an optional extra (pip install "
                                     "django-redislua[celery])")

from django_redislua.testing import RedisServer
from tests.processes import stop_group

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    with RedisServer() as server:
        yield server.url


class Client:
    """Sends the workers' tasks by name and reads their states. The tasks module is not
    imported here: its jobs name policies this process's settings do not have, and the system
    checks of every later test in this process would report them."""

    def __init__(self, broker: str) -> None:
        from celery import Celery

        self.app = Celery("jobs-client", broker=broker, backend=broker)
        self.sent: list[Any] = []

    def send(self, task: str, *args: Any) -> Any:
        result = self.app.send_task(f"tests.jobs.celery_app.{task}", args=args)
        self.sent.append(result)
        return result

    def close(self) -> None:
        """Unsubscribe from every result while the broker is up. Celery 5.7 unsubscribes in
        ``AsyncResult.__del__``: a result a failed test's traceback keeps alive would otherwise
        try it in a later test, the broker gone (an unraisable error there)."""
        for result in self.sent:
            self.app.backend.remove_pending_result(result)
        self.sent.clear()
        self.app.close()


@pytest.fixture(scope="module")
def celery(broker: str) -> Iterator[Client]:
    client = Client(broker)
    yield client
    client.close()


class Workers:
    """``count`` Celery workers of ``processes`` prefork processes each."""

    def __init__(self, broker: str, log_dir: Path, count: int = 2, processes: int = 2) -> None:
        env = {**os.environ, "JOBS_BROKER_URL": broker, "PYTHONPATH": str(ROOT)}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        self.processes = [
            subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "tests.jobs.celery_app", "worker",
                 "--pool", "prefork", "--concurrency", str(processes), "--hostname",
                 f"w{i}@%h", "--without-gossip", "--without-mingle", "--loglevel", "INFO"],
                cwd=ROOT, env=env, stdout=(log_dir / f"worker{i}.log").open("wb"),
                stderr=subprocess.STDOUT, start_new_session=True)
            for i in range(count)]
        self.log_dir = log_dir
        self.since: dict[Path, int] = {}

    def mark(self) -> None:
        """From now on, :meth:`logs` shows what the workers logged since (one test's share)."""
        self.since = {path: path.stat().st_size for path in self.log_dir.glob("worker*.log")}

    def wait_ready(self, app: Any, count: int) -> None:
        """Until every worker answers a ping (each has its pool up and consumes)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for process in self.processes:
                assert process.poll() is None, self.logs()
            if len(app.control.ping(timeout=0.5) or []) >= count:
                return
        raise AssertionError(f"workers not ready in 60 s\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(p.read_bytes()[self.since.get(p, 0):].decode(errors="replace")
                         for p in sorted(self.log_dir.glob("worker*.log")))

    def stop(self) -> None:
        for process in self.processes:
            stop_group(process)


@pytest.fixture(scope="module")
def running_workers(celery: Client, broker: str,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    running = Workers(broker, tmp_path_factory.mktemp("celery"))
    try:
        running.wait_ready(celery.app, 2)
        yield running
    finally:
        running.stop()


@pytest.fixture
def workers(running_workers: Workers) -> Workers:
    """The module's workers, their logs read from this test's start, both still up."""
    for process in running_workers.processes:
        assert process.poll() is None, running_workers.logs()
    running_workers.mark()
    return running_workers


def notes(r: Any, kind: str) -> list[list[str]]:
    return [entry.decode().split() for entry in r.lrange(f"jobs:{kind}", 0, -1)]


def wait_for(r: Any, kind: str, count: int, workers: Workers, seconds: float) -> list[list[str]]:
    """The notes of ``kind`` once there are ``count`` (the workers' logs if never)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = notes(r, kind)
        if len(found) >= count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{len(notes(r, kind))} of {count} {kind} notes\n{workers.logs()}")


def outcome(result: Any, workers: Workers, seconds: float) -> Any:
    """``result.get``, or the task's state and the workers' logs if it never came."""
    from celery.exceptions import TimeoutError as NoResult

    try:
        return result.get(timeout=seconds)
    except NoResult:
        raise AssertionError(f"task {result.id} still {result.state} after {seconds} s: "
                             f"{result.info}\n{workers.logs()}") from None


def test_30_tasks_under_5_per_10s_all_run_once_never_6_in_10s(
        celery: Client, workers: Workers, r: Any) -> None:
    sent = time.time()
    results = [celery.send("call_partner", n) for n in range(30)]
    # Ideal: 5 at once, then 5 every 10 s: the last starts 50 s after the first.
    runs = wait_for(r, "partner", 30, workers, 50 * 1.15 + 30)
    numbers = sorted(int(n) for n, *_ in runs)
    assert numbers == list(range(30)), "each task runs exactly once"
    # (asked_at, started): the admission happened between the two.
    bounds = sorted((float(started), float(asked)) for _n, asked, started, _retries in runs)
    for window in range(len(bounds) - 5):
        six = bounds[window:window + 6]
        assert six[-1][0] - min(asked for _started, asked in six) >= 10, six
    last_start = bounds[-1][0]
    assert last_start - sent <= 50 * 1.15, f"took {last_start - sent:.1f}s (ideal 50 s)"
    # Rescheduled, never retried: Celery's retry budget (max_retries=3) is not spent.
    assert {retries for *_rest, retries in runs} == {"0"}
    assert [outcome(result, workers, 10) for result in results] == list(range(30))
    assert "rate-limited by partner-api: put off by" in workers.logs()


def test_a_singleton_sent_5_times_at_once_runs_once(
        celery: Client, workers: Workers, r: Any) -> None:
    results = [celery.send("nightly", n, 2) for n in range(5)]
    wait_for(r, "nightly", 1, workers, 30)
    states = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = {result.id: result.state for result in results}
        if sorted(states.values()) == ["SKIPPED"] * 4 + ["SUCCESS"]:
            break
        time.sleep(0.05)
    assert sorted(states.values()) == ["SKIPPED"] * 4 + ["SUCCESS"], states
    assert len(notes(r, "nightly")) == 1
    skipped = next(result for result in results if result.state == "SKIPPED")
    assert "fencing token" in skipped.info["held_by"]
    assert "skipped: singleton 'tests.jobs.celery_app.nightly'" in workers.logs()


def test_a_killed_singleton_holder_frees_it_when_its_lease_ends(
        celery: Client, workers: Workers, r: Any) -> None:
    first = celery.send("nightly", 0, 60)
    (_n, pid, _started), = wait_for(r, "nightly", 1, workers, 30)
    lock_key = "rl:lock:{tests.jobs.celery_app.nightly}"
    os.kill(int(pid), signal.SIGKILL)
    left = r.pttl(lock_key)
    assert 0 < left <= 3000, "the lease is the singleton_timeout, renewed, never more"
    while r.exists(lock_key):  # the dead holder's lease runs out on its own
        time.sleep(0.05)
    second = celery.send("nightly", 1, 0)
    assert outcome(second, workers, 30) == 1
    assert [n for n, *_ in notes(r, "nightly")] == ["0", "1"]
    assert first.state != "SUCCESS"


def test_a_late_acked_singleton_whose_process_died_comes_back_after_its_lease(
        celery: Client, workers: Workers, r: Any) -> None:
    """acks_late + reject_on_worker_lost: the killed delivery comes back at once, while the
    dead process's lease still holds the singleton. Skipped, it would be acked and lost; it is
    put off until the lease ends, then runs."""
    result = celery.send("nightly_late", 7)
    (_n, pid, _redelivered, _at), = wait_for(r, "late", 1, workers, 30)
    lock_key = "rl:lock:{tests.jobs.celery_app.nightly_late}"
    os.kill(int(pid), signal.SIGKILL)
    killed_at, left = time.time(), r.pttl(lock_key) / 1000
    assert outcome(result, workers, 30) == 7  # not lost: it ran
    runs = notes(r, "late")
    assert len(runs) == 2, runs  # the killed run and the one after the lease, nothing more
    assert float(runs[1][3]) >= killed_at + left - 0.05  # not before the dead lease ended
    deadline = time.monotonic() + 30  # a worker's log reaches its file when it is flushed
    while "redelivered while its singleton is held" not in workers.logs():
        assert time.monotonic() < deadline, workers.logs()
        time.sleep(0.05)


def test_a_singleton_trigger_sent_while_it_runs_is_run_after_it_not_lost(
        celery: Client, workers: Workers, r: Any) -> None:
    first = celery.send("sync_catalog", 1, True)  # holds until the second is turned away
    wait_for(r, "catalog", 1, workers, 30)  # it holds the singleton now
    second = celery.send("sync_catalog", 2, False)
    runs = wait_for(r, "catalog", 4, workers, 30)
    assert outcome(first, workers, 30) == 1
    # Turned away while the first ran (SKIPPED, a rerun asked); its arguments ran after it.
    assert [(n, what) for n, what, _at in runs] == [
        ("1", "start"), ("1", "end"), ("2", "start"), ("2", "end")]
    assert float(runs[2][2]) >= float(runs[1][2])
    assert second.state == "SKIPPED" and second.info["rerun_queued"] is True
    assert "it runs once more when the holder finishes" in workers.logs()
    assert not r.exists("rl:lock:{catalog}:rerun")


def test_a_long_wait_is_taken_in_steps_under_the_brokers_visibility_timeout(
        celery: Client, workers: Workers, r: Any) -> None:
    """1/h: the second task must wait about an hour; sent with a countdown of limit_max_wait
    (2 s) instead, it comes back and is put off again, never held past a visibility timeout."""
    sent = {n: celery.send("hourly_report", n) for n in (1, 2)}
    # Two workers take the two at once: either may be the one the hour admits.
    (ran, ), = wait_for(r, "hourly", 1, workers, 30)
    assert outcome(sent[int(ran)], workers, 30) == int(ran)
    waiting = sent[3 - int(ran)]
    deadline = time.monotonic() + 30
    # Put off twice, and seen so between two deliveries: each delivery shows STARTED, logs
    # its denial, then stores RATE_LIMITED (state and meta read together, in one fetch).
    while True:
        meta = waiting.backend.get_task_meta(waiting.id)
        if (meta["status"] == "RATE_LIMITED"
                and workers.logs().count("rate-limited by hourly: put off by") >= 2):
            break
        assert time.monotonic() < deadline, (meta, workers.logs())
        time.sleep(0.1)
    assert meta["result"]["retry_in"] > 3000
    assert len(notes(r, "hourly")) == 1


def test_a_concurrency_policy_of_2_never_has_3_running(
        celery: Client, workers: Workers, r: Any) -> None:
    results = [celery.send("export", n) for n in range(8)]
    assert sorted(outcome(result, workers, 60) for result in results) == list(range(8))
    running = [int(n) for n, in notes(r, "export-running")]
    assert max(running) == 2, running  # two ran at once, never three
    assert r.zcard("rl:exports:cc:{tests.jobs.celery_app.export}") == 0  # every slot given back


def test_called_outside_a_worker_a_denied_task_raises_and_a_skipped_one_returns_none(
        r: Any) -> None:
    from celery import Celery

    from django_redislua.jobs.celery import JobLimited, RedisluaTask
    from django_redislua.limiting import Policy
    from django_redislua.locks import Lock

    app = Celery("outside")
    partner = Policy("jobs-outside", rate="5/10s", algorithm="sliding_log")

    @app.task(base=RedisluaTask, policies=[partner])
    def call(n: int) -> int:
        return n

    @app.task(base=RedisluaTask, singleton="jobs-outside-nightly")
    def nightly() -> str:
        return "ran"

    assert [call(n) for n in range(5)] == list(range(5))
    with pytest.raises(JobLimited, match="rate-limited by jobs-outside") as denied:
        call(5)
    assert denied.value.denied_by == ("jobs-outside",) and 9 < denied.value.retry_in <= 11
    eager = call.apply(args=(6,))
    assert eager.state == "FAILURE" and isinstance(eager.result, JobLimited)
    assert eager.result.denied_by == ("jobs-outside",) and "try again in" in str(eager.result)
    with Lock("jobs-outside-nightly", timeout=30):
        assert nightly() is None
    assert nightly() == "ran"
    app.close()
