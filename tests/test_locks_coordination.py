"""singleton, run_once, single_flight and Semaphore, with real concurrency on a real Redis."""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_redislua.connection import get_client, primary_nodes
from django_redislua.locks import (
    BuildFailed,
    Lock,
    LockNotOwned,
    RunInProgress,
    RunOutcome,
    Semaphore,
    aforget_flight,
    asingle_flight,
    forget_flight,
    run_once,
    single_flight,
    singleton,
)
from django_redislua.locks.flight import Flight
from django_redislua.recipes import VersionedCache
from django_redislua.testing import CommandRecorder
from tests.patience import PATIENT
from tests.test_locks_fair import tries

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
    """The wait_timeout is counted from the call: a first try delayed 1 s (every primary
    paused) out of a 0.5 s wait leaves no wait after it. Counted from what the server received,
    not timed (a bound on the duration fails on a loaded machine): two tries (the first; the one
    every wait begins with once subscribed), then none. Counted from after the first try, the
    wait slept 0.5 s more and tried a third time."""
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
            with CommandRecorder(get_client()) as recorder:
                for _name, node in primary_nodes(get_client()):
                    node.client_pause(1000)
                began = time.monotonic()
                with pytest.raises(RunInProgress):
                    handler()
                took = time.monotonic() - began
        finally:
            finish.set()
            first.join(10)
    assert took >= 0.5, took  # the first try did return after the deadline
    assert tries(recorder, "django_redislua.once_begin") == 2


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


# -- single_flight: a failed build's waiters share its failure (issue 35) ---------------------

class _Waiters:
    """Counts the callers of a single flight that found its build running (white-box: the
    protocol's reply reader), so a build can hold on until every caller waits on it, whatever
    the machine's speed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.lock = threading.Lock()
        original = Flight.read

        def read(flight: Flight, reply: list[Any]) -> float | None:
            wait = original(flight, reply)
            if wait is not None and flight.waiting_since:
                with self.lock:
                    self.count += 1
            return wait

        monkeypatch.setattr(Flight, "read", read)

    def reached(self, callers: int, limit: float = 10.0) -> None:
        deadline = time.monotonic() + limit
        while self.count < callers:
            assert time.monotonic() < deadline, f"{self.count} of {callers} callers waiting"
            time.sleep(0.005)

    async def areached(self, callers: int, limit: float = 10.0) -> None:
        deadline = time.monotonic() + limit
        while self.count < callers:
            assert time.monotonic() < deadline, f"{self.count} of {callers} callers waiting"
            await asyncio.sleep(0.005)


def _outage(callers: int, waiters: _Waiters, call: Callable[[Callable[[], Any]], Any]
            ) -> tuple[list[BaseException], int, float, list[float]]:
    """``callers`` threads call ``call(build)`` on one missing key; the build waits until the
    others wait on it, then raises after 0.4 s. The callers' exceptions, how many builds ran,
    when the build ended, and when each caller got its exception (monotonic)."""
    builds: list[float] = []

    def build() -> Any:
        builds.append(time.monotonic())
        waiters.reached(callers - 1)
        time.sleep(0.4)
        builds.append(time.monotonic())
        raise RuntimeError("database down")

    ended: list[float] = []

    def caller() -> BaseException:
        try:
            call(build)
        except Exception as exc:
            ended.append(time.monotonic())
            return exc
        raise AssertionError("the build raised, the call did not")

    failures = _together(callers, caller)
    return failures, len(builds) // 2, builds[1], ended


def _assert_shared(failures: list[BaseException], builds: int, built_until: float,
                   ended: list[float], cache_key: str) -> None:
    assert builds == 1  # was 10: each waiter built in turn after the one before failed
    assert sum(isinstance(f, RuntimeError) for f in failures) == 1  # the builder's own
    shared = [f for f in failures if isinstance(f, BuildFailed)]
    assert len(shared) == len(failures) - 1
    assert {(f.cache_key, f.error, f.message) for f in shared} == {
        (cache_key, "builtins.RuntimeError", "database down")}
    # Woken by the failure, not by a build of their own: the last caller waited one build
    # (it waited 4 s: ten 0.4 s builds in turn).
    assert max(ended) - built_until < 1.0, max(ended) - built_until


def test_single_flight_waiters_share_a_failed_build(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    waiters = _Waiters(monkeypatch)
    outcome = _outage(10, waiters, lambda build: single_flight("outage", build))
    _assert_shared(*outcome, "outage")
    assert not r.exists("rl:flight:{outage}", "rl:flight:{outage}:building")


def test_get_or_build_waiters_share_a_failed_build(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    cache, waiters = VersionedCache("catalog"), _Waiters(monkeypatch)
    outcome = _outage(10, waiters, lambda build: cache.get_or_build("page:1", build))
    _assert_shared(*outcome, "page:1")
    assert cache.get_versioned("page:1") is None


@pytest.mark.parametrize("call", ["asingle_flight", "aget_or_build"])
async def test_async_waiters_share_a_failed_build(
        monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    waiters, builds = _Waiters(monkeypatch), []

    async def build() -> str:
        builds.append(1)
        await waiters.areached(9)
        await asyncio.sleep(0.4)
        raise RuntimeError("database down")

    cache = VersionedCache("acatalog")

    async def caller() -> BaseException:
        try:
            if call == "asingle_flight":
                await asingle_flight("aoutage", build)
            else:
                await cache.aget_or_build("aoutage", build)
        except Exception as exc:
            return exc
        raise AssertionError("the build raised, the call did not")

    began = time.monotonic()
    failures = await asyncio.wait_for(asyncio.gather(*(caller() for _ in range(10))), 30)
    took = time.monotonic() - began
    assert builds == [1]
    assert sum(isinstance(f, RuntimeError) for f in failures) == 1
    assert sum(isinstance(f, BuildFailed) for f in failures) == 9
    assert took < 0.4 + 2.0, took  # one build and the wake-ups (was ten builds: 4 s)


def test_a_caller_after_a_failed_build_builds_again(r: redis.Redis) -> None:
    """The failure is kept only for the callers that waited on that build: a caller arriving
    after it builds (the next try), even while the failure is still kept for late waiters."""
    def broken() -> int:
        raise ValueError("backend down")

    with pytest.raises(ValueError):
        single_flight("retry", broken)
    with pytest.raises(ValueError):  # built again, not a BuildFailed of the first build
        single_flight("retry", broken)
    assert single_flight("retry", lambda: 7) == 7
    assert not r.exists("rl:flight:{retry}:failed")  # a stored value clears the failure


def test_a_failure_is_kept_at_most_one_build_lease(r: redis.Redis) -> None:
    def broken() -> int:
        raise ValueError("x" * 5000)

    with pytest.raises(ValueError):
        single_flight("bounded", broken, lock_timeout=2)
    assert 0 < r.pttl("rl:flight:{bounded}:failed") <= 2000
    assert len(r.hget("rl:flight:{bounded}:failed", "message")) == 1000


async def test_a_cancelled_build_is_not_shared_a_waiter_builds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A build that did not fail but was cancelled (or interrupted) leaves no failure: a
    waiter builds instead of raising BuildFailed."""
    started, waiters = asyncio.Event(), _Waiters(monkeypatch)

    async def endless() -> str:
        started.set()
        await asyncio.sleep(30)
        return "never"

    async def build() -> str:
        return "built by the waiter"

    builder = asyncio.ensure_future(asingle_flight("cancelled", endless))
    await asyncio.wait_for(started.wait(), 5)
    waiter = asyncio.ensure_future(asingle_flight("cancelled", build))
    await waiters.areached(1)
    builder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await builder
    assert await asyncio.wait_for(waiter, 5) == "built by the waiter"


# -- single_flight: invalidation --------------------------------------------------------------

def test_forget_flight_makes_the_next_call_build(r: redis.Redis) -> None:
    assert single_flight("menu", lambda: "v1", ttl=60) == "v1"
    assert forget_flight("menu") is True
    assert forget_flight("menu") is False
    assert single_flight("menu", lambda: "v2", ttl=60) == "v2"
    assert single_flight("menu", lambda: "never", ttl=60) == "v2"


def test_forget_flight_drops_a_stale_copy_too(r: redis.Redis) -> None:
    assert single_flight("stale-menu", lambda: "v1", ttl=0.05, stale_ttl=60) == "v1"
    time.sleep(0.1)
    assert forget_flight("stale-menu") is True
    assert single_flight("stale-menu", lambda: "v2", ttl=60) == "v2"


def test_forgetting_during_a_build_never_stores_its_old_value(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """The build running at the invalidation read the data before it: its caller gets its
    value, nothing stores it, no second build runs beside it, and the next build stores."""
    started, finish = threading.Event(), threading.Event()
    builds: list[str] = []
    waiters = _Waiters(monkeypatch)

    def old_build() -> str:
        builds.append("old")
        started.set()
        assert finish.wait(10)
        return "old"

    results: list[str] = []
    builder = threading.Thread(target=lambda: results.append(
        single_flight("prices", old_build, ttl=60)))
    builder.start()
    assert started.wait(10)
    assert forget_flight("prices") is False  # nothing cached yet; the running build is marked
    waiter_results: list[str] = []

    def new_build() -> str:
        builds.append("new")
        return "new"

    # A caller arriving after the invalidation waits for the running build (never two at
    # once), then builds anew: the old value was not stored.
    waiter = threading.Thread(target=lambda: waiter_results.append(
        single_flight("prices", new_build, ttl=60)))
    waiter.start()
    waiters.reached(1)
    assert builds == ["old"]
    finish.set()
    builder.join(10)
    waiter.join(10)
    assert results == ["old"] and waiter_results == ["new"]
    assert builds == ["old", "new"]
    assert single_flight("prices", lambda: "never", ttl=60) == "new"


async def test_aforget_flight(r: redis.Redis) -> None:
    async def v1() -> str:
        return "v1"

    async def v2() -> str:
        return "v2"

    assert await asingle_flight("amenu", v1) == "v1"
    assert await aforget_flight("amenu") is True
    assert await asingle_flight("amenu", v2) == "v2"


def test_versioned_cache_delete_during_a_build_never_stores_its_old_value(r: redis.Redis) -> None:
    cache = VersionedCache("catalog")
    assert cache.get_or_build("page:3", lambda: "v1", ttl=0.05, stale_ttl=60) == "v1"
    time.sleep(0.1)  # stale now: the next call rebuilds

    def build() -> str:
        assert cache.delete("page:3") is True  # the data changed while this build ran
        return "built before the change"

    assert cache.get_or_build("page:3", build, ttl=60) == "built before the change"
    assert cache.get_versioned("page:3") is None
    assert cache.get_or_build("page:3", lambda: "rebuilt", ttl=60) == "rebuilt"
    assert cache.get("page:3") == "rebuilt"


# -- run_once: the outcome of a call (issue 35) -----------------------------------------------

def _server_now(r: Any) -> datetime:
    seconds, micros = r.time()  # on the cluster, one node's: they share this machine's clock
    return datetime.fromtimestamp(seconds + micros / 1e6, UTC)


def test_run_once_outcome_says_who_ran_it_and_when(r: Any) -> None:
    runs = []

    @run_once(key=lambda n: f"invoice:{n}")
    def send(n: int) -> str:
        runs.append(n)
        return f"sent {n}"

    here = f"{socket.gethostname()}:{os.getpid()}"
    before = _server_now(r)
    ran = send.outcome(1)
    after = _server_now(r)
    assert ran.status == "ran" and ran.result == "sent 1" and ran.ran_by == here
    assert ran.started_at is not None and ran.finished_at is not None
    assert before - timedelta(milliseconds=1) <= ran.started_at <= ran.finished_at
    assert ran.finished_at <= after + timedelta(milliseconds=1)
    again = send.outcome(1)
    assert again == RunOutcome("done", "sent 1", ran_by=here, started_at=ran.started_at,
                               finished_at=ran.finished_at)
    assert send(1) == "sent 1"  # the plain call still returns the result
    assert runs == [1]
    record = r.hgetall("rl:once:{invoice:1}")
    assert set(record) == {b"state", b"result", b"by", b"started_at", b"finished_at"}
    assert sum(len(k) + len(v) for k, v in record.items()) < 300  # bounded, beside the result


def test_run_once_outcome_while_another_call_runs_it() -> None:
    started, finish = threading.Event(), threading.Event()

    @run_once(key="export", timeout=30, wait=False)
    def export() -> str:
        started.set()
        assert finish.wait(10)
        return "exported"

    first = threading.Thread(target=export)
    first.start()
    try:
        assert started.wait(10)
        running = export.outcome()
        with pytest.raises(RunInProgress):  # the plain call raises, as before
            export()
    finally:
        finish.set()
        first.join(10)
    assert running.status == "running" and running.result is None
    assert running.ran_by == f"{socket.gethostname()}:{os.getpid()}"
    assert running.started_at is not None and running.lease_ends_at is not None
    # started_at is the script's TIME in ms; the lease end is a later call's TIME + PTTL,
    # and the expiry was set from Redis's own command time, which may be a millisecond on
    # (two clocks read at millisecond grain): 30 s, to within those 2 ms
    lease = running.lease_ends_at - running.started_at
    assert timedelta(seconds=29) < lease <= timedelta(seconds=30, milliseconds=2), lease
    assert export.outcome().status == "done"


def test_run_once_outcome_after_wait_timeout_is_running() -> None:
    started, finish = threading.Event(), threading.Event()

    @run_once(key="slow-export", wait_timeout=0.2)
    def export() -> str:
        started.set()
        assert finish.wait(10)
        return "exported"

    first = threading.Thread(target=export)
    first.start()
    try:
        assert started.wait(10)
        assert export.outcome().status == "running"
    finally:
        finish.set()
        first.join(10)
    done = export.outcome()
    assert done.status == "done" and done.result == "exported"


def test_run_once_outcome_of_a_waiting_duplicate_is_done() -> None:
    started, finish = threading.Event(), threading.Event()

    @run_once(key="shared-export")
    def export() -> str:
        started.set()
        assert finish.wait(10)
        return "exported"

    first = threading.Thread(target=export)
    first.start()
    assert started.wait(10)
    outcomes: list[RunOutcome[str]] = []
    duplicate = threading.Thread(target=lambda: outcomes.append(export.outcome()))
    duplicate.start()
    finish.set()
    first.join(10)
    duplicate.join(10)
    assert [(o.status, o.result) for o in outcomes] == [("done", "exported")]


def test_run_once_reads_a_record_written_before_outcomes(r: Any) -> None:
    """A rolling deploy: records written by the previous version (state, owner, result only)
    are read; who ran it and when are then unknown (None)."""
    @run_once(key="legacy", wait=False)
    def handler() -> str:
        return "ran again"

    r.hset("rl:once:{legacy}", mapping={"state": "running", "owner": "0" * 32})
    r.pexpire("rl:once:{legacy}", 5000)
    running = handler.outcome()
    assert (running.status, running.ran_by, running.started_at) == ("running", None, None)
    assert running.lease_ends_at is not None
    r.delete("rl:once:{legacy}")
    r.hset("rl:once:{legacy}", mapping={"state": "done", "result": pickle.dumps("old result")})
    assert handler.outcome() == RunOutcome("done", "old result")
    assert handler() == "old result"


def test_a_record_written_by_outcomes_is_read_by_the_previous_version(r: Any) -> None:
    """The other direction of a rolling deploy: the fields the previous version's once_begin
    read (state, then result) keep their meaning in a record this version wrote."""
    @run_once(key="forward")
    def handler() -> str:
        return "new result"

    assert handler() == "new result"
    record = r.hgetall("rl:once:{forward}")
    assert record[b"state"] == b"done" and pickle.loads(record[b"result"]) == "new result"


async def test_async_run_once_outcome() -> None:
    runs = []

    @run_once(key=lambda n: f"areport:{n}")
    async def report(n: int) -> int:
        runs.append(n)
        await asyncio.sleep(0)
        return n * 2

    ran = await report.outcome(3)
    assert (ran.status, ran.result) == ("ran", 6)
    assert ran.ran_by == f"{socket.gethostname()}:{os.getpid()}"
    done = await report.outcome(3)
    assert (done.status, done.result, done.finished_at) == ("done", 6, ran.finished_at)
    assert await report(3) == 6
    assert runs == [3]
