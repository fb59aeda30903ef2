"""``run_once`` when the process running the job dies (issue 35): a child process
(tests/processes.py), with its own Django and Redis clients, starts the job and is SIGKILLed
mid-run; the job must fall to the next try once the child's running lease ends, and a duplicate
already waiting takes it over.

The lease is 2 s, renewed every 2/3 s by the child while it lives, so its expiry after the
kill is the only timing here: the takeover is asserted within that lease plus 1.5 s of slack
(a loaded machine's scheduling), and every other wait is bounded by ``LIMIT``.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from django_redislua.conf import settings as conf
from django_redislua.locks import RunOutcome, run_once
from tests.processes import CHILDREN, setup_django
from tests.test_locks_async import _subscribers

pytestmark = [pytest.mark.slow, pytest.mark.topologies]
LIMIT = 60.0  # seconds: the bound on every wait, never reached when sane
LEASE = 2.0  # the job's running lease (run_once's timeout)
STARTED, RUNS = "test:started", "test:runs"
CHANNEL = "rl:once:{nightly-report:2026-01-01}:released"  # wakes the duplicates waiting


def _job(wait: bool) -> Callable[..., Any]:
    """The cron job, as every process declares it: run once per day's key."""

    @run_once(key="nightly-report:2026-01-01", timeout=LEASE, wait=wait, wait_timeout=LIMIT)
    def nightly_report(crash: bool) -> str:
        from django_redislua.connection import get_client

        client = get_client()
        client.rpush(RUNS, os.getpid())
        if crash:  # the child: sleeps until the test kills it
            client.set(STARTED, os.getpid())
            time.sleep(LIMIT)
        return f"report by {os.getpid()}"

    return nightly_report


def _crashing_run(connection: str) -> None:
    """The child: Django set up on the parent's connection, then the job, which never ends."""
    setup_django(connection)
    _job(wait=False)(crash=True)


def _start_and_kill_later(r: Any) -> tuple[Any, Callable[[], float]]:
    """A child running the job; and a function that SIGKILLs it, returning when (monotonic)."""
    child = CHILDREN.Process(target=_crashing_run, args=(conf.CONNECTION,))
    child.start()
    deadline = time.monotonic() + LIMIT
    while r.get(STARTED) is None:
        assert time.monotonic() < deadline, "the child never started the job"
        assert child.exitcode is None, "the child died before the job started"
        time.sleep(0.01)

    def kill() -> float:
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        child.join(LIMIT)
        return killed_at

    return child, kill


def _here() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def test_a_killed_run_is_run_by_the_next_try_after_its_lease(r: Any) -> None:
    child, kill = _start_and_kill_later(r)
    try:
        job = _job(wait=False)
        running = job.outcome(crash=False)
        assert running.status == "running" and running.ran_by == f"{socket.gethostname()}:" \
            f"{child.pid}"
        assert running.lease_ends_at is not None and running.started_at is not None
        killed_at = kill()
        while (outcome := job.outcome(crash=False)).status == "running":  # the next tries
            assert time.monotonic() - killed_at < LIMIT
            time.sleep(0.02)
        freed_after = time.monotonic() - killed_at
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    assert child.exitcode == -signal.SIGKILL
    assert (outcome.status, outcome.result, outcome.ran_by) == (
        "ran", f"report by {os.getpid()}", _here())
    assert freed_after < LEASE + 1.5, freed_after
    assert [int(pid) for pid in r.lrange(RUNS, 0, -1)] == [child.pid, os.getpid()]
    assert job.outcome(crash=False).status == "done"


def test_a_waiting_duplicate_takes_over_a_killed_run(r: Any) -> None:
    child, kill = _start_and_kill_later(r)
    outcomes: list[tuple[RunOutcome[str], float]] = []
    waiting = threading.Thread(target=lambda: outcomes.append(
        (_job(wait=True).outcome(crash=False), time.monotonic())))
    try:
        waiting.start()
        deadline = time.monotonic() + LIMIT
        while _subscribers(CHANNEL) < 1:  # the duplicate found the run and waits for it
            assert time.monotonic() < deadline, "the duplicate never waited"
            time.sleep(0.01)
        killed_at = kill()
        waiting.join(LIMIT)
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    [(outcome, at)] = outcomes
    assert (outcome.status, outcome.result, outcome.ran_by) == (
        "ran", f"report by {os.getpid()}", _here())
    assert at - killed_at < LEASE + 1.5, at - killed_at
    assert [int(pid) for pid in r.lrange(RUNS, 0, -1)] == [child.pid, os.getpid()]
