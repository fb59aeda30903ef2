"""singleton, run_once, single_flight and Semaphore, with real concurrency on a real Redis."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_redislua.connection import get_client, primary_nodes
from django_redislua.locks import (
    Lock,
    LockNotOwned,
    RunInProgress,
    Semaphore,
    run_once,
    single_flight,
    singleton,
)
from tests.test_lost_replies import PATIENT

pytestmark = pytest.mark.topologies


def _together(callers: int, call: Callable[[], Any]) -> list[Any]:
    """Run ``call`` from ``callers`` threads released at the same instant; their results."""
    barrier = threading.Barrier(callers)

    def go() -> Any:
        barrier.wait(10)
        return call()

    with ThreadPoolExecutor(callers) as pool:
        futures = [pool.submit(go) for _ in range(callers)]
        return [f.result(timeout=60) for f in futures]


def test_single_flight_builds_once_for_50_concurrent_callers(r: redis.Redis) -> None:
    def build() -> dict[str, int]:
        r.incr("builds")
        time.sleep(0.2)  # long enough that every caller arrives during the build
        return {"answer": 42}

    results = _together(50, lambda: single_flight("hot", build, ttl=60, lock_timeout=10))
    assert r.get("builds") == b"1"
    assert results == [{"answer": 42}] * 50
    assert single_flight("hot", build) == {"answer": 42}
    assert r.get("builds") == b"1"


def test_single_flight_failure_stores_nothing_and_the_next_caller_builds(r: redis.Redis) -> None:
    def broken() -> int:
        raise RuntimeError("backend down")

    with pytest.raises(RuntimeError):
        single_flight("flaky", broken)
    assert not r.exists("rl:flight:{flaky}:building")
    assert single_flight("flaky", lambda: 7) == 7


def test_single_flight_serves_the_stale_copy_while_rebuilding(r: redis.Redis) -> None:
    assert single_flight("stale", lambda: "old", ttl=0.2, stale_ttl=30) == "old"
    time.sleep(0.3)
    rebuilding = threading.Event()
    finish = threading.Event()

    def slow_build() -> str:
        rebuilding.set()
        finish.wait(5)
        return "new"

    builder = threading.Thread(target=lambda: single_flight("stale", slow_build, ttl=30))
    builder.start()
    assert rebuilding.wait(5)
    assert single_flight("stale", lambda: "never built") == "old"
    finish.set()
    builder.join(5)
    assert single_flight("stale", lambda: "never built") == "new"


def test_run_once_runs_the_handler_once_for_20_concurrent_duplicates(r: redis.Redis) -> None:
    @run_once(key=lambda order_id, **kw: f"pay:{order_id}", ttl="1d")
    def pay(order_id: int, amount: int) -> str:
        r.incr("payments")
        time.sleep(0.2)
        return f"paid {order_id} {amount}"

    results = _together(20, lambda: pay(7, amount=10))
    assert r.get("payments") == b"1"
    assert results == ["paid 7 10"] * 20
    assert pay(7, amount=10) == "paid 7 10"
    assert pay(8, amount=10) == "paid 8 10"
    assert r.get("payments") == b"2"


def test_run_once_failure_stores_nothing(r: redis.Redis) -> None:
    calls = []

    @run_once(key="flaky")
    def handler() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("first try fails")
        return len(calls)

    with pytest.raises(ValueError):
        handler()
    assert not r.exists("rl:once:{flaky}")
    assert handler() == 2
    assert handler() == 2
    assert len(calls) == 2


def test_run_once_duplicate_without_waiting_gets_in_progress() -> None:
    started, finish = threading.Event(), threading.Event()

    @run_once(key="slow", wait=False)
    def handler() -> str:
        started.set()
        finish.wait(5)
        return "done"

    first = threading.Thread(target=handler)
    first.start()
    assert started.wait(5)
    with pytest.raises(RunInProgress):
        handler()
    finish.set()
    first.join(5)
    assert handler() == "done"


def test_run_once_waiting_duplicate_gives_up_after_wait_timeout() -> None:
    started, finish = threading.Event(), threading.Event()

    @run_once(key="slower", wait_timeout=0.2)
    def handler() -> str:
        started.set()
        finish.wait(5)
        return "done"

    first = threading.Thread(target=handler)
    first.start()
    assert started.wait(5)
    with pytest.raises(RunInProgress):
        handler()
    finish.set()
    first.join(5)


def test_run_once_a_slow_first_try_counts_against_wait_timeout() -> None:
    """The wait_timeout is counted from the call: a first try delayed 0.5 s (every primary
    paused) out of a 0.5 s wait leaves no wait after it (it was 1 s and more)."""
    from tests.settings import REDISLUA as current  # the topology fixture may have changed it

    started, finish = threading.Event(), threading.Event()

    @run_once(key="slow-first-once", wait_timeout=0.5)
    def handler() -> str:
        started.set()
        finish.wait(10)
        return "done"

    with override_settings(REDISLUA={**current, **PATIENT}):
        first = threading.Thread(target=handler)
        first.start()
        try:
            assert started.wait(5)
            for _name, node in primary_nodes(get_client()):
                node.client_pause(500)
            began = time.monotonic()
            with pytest.raises(RunInProgress):
                handler()
            took = time.monotonic() - began
        finally:
            finish.set()
            first.join(10)
    assert 0.45 <= took < 0.8, took


def test_singleton_skips_while_another_instance_runs(
        r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    started, finish = threading.Event(), threading.Event()

    @singleton("nightly-sync", timeout="10m")
    def sync() -> str:
        started.set()
        finish.wait(5)
        return "synced"

    results: list[str | None] = []
    first = threading.Thread(target=lambda: results.append(sync()))
    first.start()
    assert started.wait(5)
    with caplog.at_level(logging.INFO, logger="django_redislua.locks"):
        assert sync() is None
    token = r.hget("rl:lock:{nightly-sync}", "token").decode()
    [skipped] = [rec.getMessage() for rec in caplog.records if "skipped" in rec.getMessage()]
    assert skipped.startswith("singleton 'nightly-sync' skipped: another instance holds it "
                              f"(fencing token {token}, lease ends in ")
    finish.set()
    first.join(5)
    assert results == ["synced"]
    assert not r.exists("rl:lock:{nightly-sync}")
    assert sync() == "synced"


def test_singleton_wait_runs_after_the_other_instance() -> None:
    order: list[str] = []
    holder = Lock("queue-job", timeout=5)
    holder.acquire()

    @singleton("queue-job", timeout=5, wait=True, blocking_timeout=5)
    def job() -> str:
        order.append("job")
        return "ran"

    waiter = threading.Thread(target=lambda: order.append(str(job())))
    waiter.start()
    time.sleep(0.2)
    order.append("released")
    holder.release()
    waiter.join(5)
    assert order == ["released", "job", "ran"]


def test_semaphore_admits_at_most_limit_and_wakes_a_waiter(r: redis.Redis) -> None:
    first, second = Semaphore("exports", limit=2, timeout="5m"), Semaphore("exports", 2, 300)
    assert first.acquire() and second.acquire()
    third = Semaphore("exports", limit=2, timeout=300, blocking_timeout=5)
    assert not third.acquire(blocking=False)
    assert r.zcard("rl:sem:{exports}") == 2
    got: list[float] = []
    waiter = threading.Thread(target=lambda: third.acquire() and got.append(time.monotonic()))
    waiter.start()
    time.sleep(0.2)
    released_at = time.monotonic()
    first.release()
    waiter.join(5)
    assert got and got[0] - released_at < 0.1
    second.release()
    third.release()
    assert r.zcard("rl:sem:{exports}") == 0


def test_semaphore_permits_expire() -> None:
    crashed = Semaphore("leases", limit=1, timeout=0.3)
    assert crashed.acquire()
    started = time.monotonic()
    with Semaphore("leases", limit=1, timeout=5, blocking_timeout=3):
        assert 0.2 < time.monotonic() - started < 1.0
    with pytest.raises(LockNotOwned):
        crashed.release()


def test_semaphore_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Semaphore("bad", limit=0, timeout=1)
