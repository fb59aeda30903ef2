"""Recipes acceptance with real processes (issue 16): children (tests/processes.py), each with
its own Django and Redis clients, racing on one Inventory, one WorkQueue (whose workers the test
SIGKILLs) and one VersionedCache entry. Every child writes what it saw to Redis; the test judges
the logs.

Children start together: each says it is ready (INCR), the test says go, and only then do their
threads start calling. Every wait is bounded (``LIMIT``). The assertions judge what Redis
answered, not how fast the machine is; the one timing premise is the WorkQueue test's: a live
worker finishes a task within its visibility timeout (1.5 s to spare), and the test reaps the
worker it chose to kill before that worker's task could end (1 s to spare).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from django_redislua.conf import settings as conf
from django_redislua.recipes import Inventory, QueueStats, Versioned, VersionedCache, WorkQueue
from tests.processes import CHILDREN, setup_django

pytestmark = [pytest.mark.slow, pytest.mark.topologies]
LIMIT = 120.0  # seconds: the bound on every wait (children and parent), never reached when sane
PROCESSES = 4
READY, GO, LOG = "test:ready", "test:go", "test:log"


# -- running children together ----------------------------------------------------------------

def _client() -> Any:
    from django_redislua.connection import get_client

    return get_client()


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIMIT
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {LIMIT}s for {what}")
        time.sleep(0.005)


def _threads_together(client: Any, works: list[Callable[[], None]]) -> None:
    """Start one thread per work, say ready, wait for the test's go, release every thread at
    once; raise the first error a thread met (the child then exits non-zero)."""
    go = threading.Event()
    errors: list[BaseException] = []

    def run(work: Callable[[], None]) -> None:
        try:
            if not go.wait(LIMIT):
                raise TimeoutError("never released")
            work()
        except BaseException as exc:
            errors.append(exc)
            raise

    pool = [threading.Thread(target=run, args=(work,)) for work in works]
    for thread in pool:
        thread.start()
    client.incr(READY)
    _wait_for(lambda: bool(client.exists(GO)), "the test's go")
    go.set()
    for thread in pool:
        thread.join(LIMIT)
    if any(thread.is_alive() for thread in pool):
        raise TimeoutError("a thread ran past the limit")
    if errors:
        raise errors[0]


def _run_together(r: Any, target: Callable[..., None], args: list[tuple[Any, ...]]) -> None:
    """Run ``target(connection, *a)`` in one spawned process per ``a``; go once all are ready."""
    workers = [CHILDREN.Process(target=target, args=(conf.CONNECTION, *a)) for a in args]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + LIMIT
    try:
        while int(r.get(READY) or 0) < len(workers):
            assert time.monotonic() < deadline, "the children never all became ready"
            assert all(w.exitcode in (None, 0) for w in workers), "a child died before go"
            time.sleep(0.01)
        r.set(GO, 1)
        for worker in workers:
            worker.join(max(deadline - time.monotonic(), 0.1))
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
                worker.join()
    assert [w.exitcode for w in workers] == [0] * len(workers)


def _log(r: Any) -> list[Any]:
    return [json.loads(raw) for raw in r.lrange(LOG, 0, -1)]


# -- Inventory: a flash sale, then a refund storm ---------------------------------------------

SALE, SKU = "flash", "sku-1"
THREADS = 16


def _buy(connection: str, plan: list[list[tuple[str, str, int]]], one_per_user: bool) -> None:
    """Each thread takes each of its orders ``tries`` times, the calls shuffled together."""
    setup_django(connection)
    client, inventory = _client(), Inventory(SALE)

    def buyer(orders: list[tuple[str, str, int]]) -> Callable[[], None]:
        def work() -> None:
            calls = [(order, user) for order, user, tries in orders for _ in range(tries)]
            random.shuffle(calls)
            answers = []
            for order, user in calls:
                taken = inventory.take(SKU, order_id=order, user_id=user,
                                       one_per_user=one_per_user)
                answers.append(json.dumps([order, user, taken.ok, taken.reason, taken.left]))
            client.rpush(LOG, *answers)

        return work

    _threads_together(client, [buyer(orders) for orders in plan])


def _sale_plan(orders: int, users: int) -> tuple[list[list[list[tuple[str, str, int]]]], int]:
    """Every order given to two threads of two different processes, each trying it 2 or 3
    times; returns the plan per process and thread, and the calls it makes."""
    rng = random.Random(16)
    plan: list[list[list[tuple[str, str, int]]]] = [
        [[] for _ in range(THREADS)] for _ in range(PROCESSES)]
    calls = 0
    for n in range(orders):
        for process in rng.sample(range(PROCESSES), 2):
            thread = min(plan[process], key=len)  # spread evenly: every thread has orders
            tries = rng.choice((2, 3))
            thread.append((f"order-{n}", f"user-{n % users}", tries))
            calls += tries
    return plan, calls


@pytest.mark.parametrize("one_per_user", [False, True], ids=["orders", "one_per_user"])
def test_4_processes_x_16_threads_buying_100_units_of_60(r: Any, one_per_user: bool) -> None:
    """100 orders of one unit from 40 users, each order retried 2-3 times by two threads of two
    processes, racing for 60 units. Without one_per_user: exactly 60 sold, each to one order,
    and every order's answers agree (ok then duplicate_order, or only insufficient). With
    one_per_user: each user ends up holding exactly one order (40 sold, 20 left), the user's
    other orders answered only duplicate_user."""
    inventory = Inventory(SALE)
    stock, orders_key, buyers_key = inventory.keys(SKU)
    users = 40
    sold = 40 if one_per_user else 60
    assert inventory.set(SKU, 60) == 60
    plan, calls = _sale_plan(100, users)
    _run_together(r, _buy, [(threads, one_per_user) for threads in plan])

    answers: dict[str, list[tuple[bool, str, int]]] = defaultdict(list)
    for order, _user, ok, reason, left in _log(r):
        answers[order].append((ok, reason, left))
    assert sum(map(len, answers.values())) == calls  # every call answered and logged
    assert len(answers) == 100
    taken = {order for order, seen in answers.items() if (True, "ok") in
             {(ok, reason) for ok, reason, _ in seen}}
    # Each order took at most once, and the units taken are the units sold.
    for order, seen in answers.items():
        reasons = Counter(reason for _, reason, _ in seen)
        if order in taken:
            assert reasons["ok"] == 1, (order, seen)
            assert {(ok, reason) for ok, reason, _ in seen} <= {
                (True, "ok"), (True, "duplicate_order")}, (order, seen)
        else:
            refused = "duplicate_user" if one_per_user else "insufficient"
            assert {(ok, reason) for ok, reason, _ in seen} == {(False, refused)}, (order, seen)
    assert len(taken) == sold
    # Each unit left the stock once: the units left after the "ok" answers are all different.
    lefts = sorted(left for seen in answers.values() for ok, reason, left in seen
                   if reason == "ok")
    assert lefts == list(range(60 - sold, 60))
    # Redis agrees: the stock, the ledger of orders holding units, the buyers.
    assert inventory.level(SKU) == 60 - sold
    assert r.hgetall(stock) == {b"left": str(60 - sold).encode(), b"sold": str(sold).encode()}
    ledger = {k.decode(): v.decode() for k, v in r.hgetall(orders_key).items()}
    assert set(ledger) == taken
    assert not any(v.startswith("r") for v in ledger.values())
    buyers = {k.decode(): v.decode() for k, v in r.hgetall(buyers_key).items()}
    holders = [ledger[order].split(" ")[1] for order in taken]
    assert all(ledger[order].split(" ")[0] == "1" for order in taken)
    # Each user holding units, counting the orders it holds (the buyers hash's layout).
    assert buyers == {user: str(n) for user, n in Counter(holders).items()}
    if one_per_user:
        assert sorted(holders) == sorted(f"user-{u}" for u in range(users))  # one each


def _refund(connection: str, threads: int, orders: list[str], rounds: int) -> None:
    """Each thread gives back every order ``rounds`` times, in its own random order."""
    setup_django(connection)
    client, inventory = _client(), Inventory(SALE)

    def work() -> None:
        calls = orders * rounds
        random.shuffle(calls)
        answers = []
        for order in calls:
            given = inventory.give_back(SKU, order)
            answers.append(json.dumps([order, given.ok, given.reason, given.left]))
        client.rpush(LOG, *answers)

    _threads_together(client, [work] * threads)


def test_refund_storm_restores_exactly_what_was_taken(r: Any) -> None:
    """After a sale of 60 units to 30 orders of 1-3 units from 7 users (20 more orders
    refused), 4 processes x 16 threads give back each of the 50 orders twice: 6400 calls. Each
    order that took gets exactly one "ok" (the others: already_given_back), each refused one
    only unknown_order, and the stock is back to exactly 60, no order holding units, no buyer
    left (each user's count of holding orders went down once per order)."""
    inventory = Inventory(SALE)
    stock, orders_key, buyers_key = inventory.keys(SKU)
    inventory.set(SKU, 60)
    qty = {f"order-{n}": n % 3 + 1 for n in range(50)}
    sold = {order for n, (order, units) in enumerate(qty.items())
            if inventory.take(SKU, units, order_id=order, user_id=f"user-{n % 7}").ok}
    assert len(sold) == 30 and inventory.level(SKU) == 0 and r.hlen(buyers_key) == 7
    _run_together(r, _refund, [(THREADS, list(qty), 2)] * PROCESSES)

    answers: dict[str, list[tuple[bool, str, int]]] = defaultdict(list)
    for order, ok, reason, left in _log(r):
        answers[order].append((ok, reason, left))
    assert {order: len(seen) for order, seen in answers.items()} == {
        order: PROCESSES * THREADS * 2 for order in qty}
    for order, seen in answers.items():
        reasons = Counter((ok, reason) for ok, reason, _ in seen)
        if order in sold:
            assert reasons == {(True, "ok"): 1, (False, "already_given_back"): len(seen) - 1}
        else:
            assert reasons == {(False, "unknown_order"): len(seen)}
    # The "ok" answers line up as one serial history: each adds its order's units to the last.
    returned = sorted((left, order) for order, seen in answers.items()
                      for ok, _, left in seen if ok)
    assert [left for left, _ in returned] == list(
        itertools.accumulate(qty[order] for _, order in returned))
    assert inventory.level(SKU) == 60
    assert r.hgetall(stock) == {b"left": b"60", b"sold": b"0"}
    assert all(v.startswith(b"r") for v in r.hgetall(orders_key).values())
    assert r.hlen(orders_key) == 30 and not r.exists(buyers_key)
    assert inventory.take(SKU, order_id="order-0", user_id="user-0") == (
        False, "duplicate_order", 60)  # an order id given back cannot take again


# -- WorkQueue: workers SIGKILLed mid-task ----------------------------------------------------

QUEUE, STOP = "jobs", "test:stop"
TASKS, WORKERS, KILLS = 200, 4, 4
VISIBILITY = 3.0  # seconds: twice the longest task, so a live worker never overruns
LONG, SHORT = 1.5, 0.02  # seconds of work: the first run of every 25th task is long (killed)


def _queue() -> WorkQueue:
    return WorkQueue(QUEUE, max_in_flight=2 * WORKERS, visibility_timeout=VISIBILITY)


def _work(connection: str) -> None:
    """Claim, log the start (wall clock, before the work), work, ack, log the end and the ack's
    answer; until the test says stop."""
    setup_django(connection)
    client, queue, pid = _client(), _queue(), os.getpid()
    deadline = time.monotonic() + LIMIT
    while not client.exists(STOP):
        if time.monotonic() > deadline:
            raise TimeoutError("the worker ran past the limit")
        task = queue.claim()
        if task is None:
            time.sleep(0.01)
            continue
        work = LONG if task.payload["long"] and task.attempts == 1 else SHORT
        run = {"task": task.id, "pid": pid, "attempts": task.attempts,
               "deadline": task.deadline, "work": work}
        client.rpush(LOG, json.dumps({**run, "at": "start", "time": time.time()}))
        time.sleep(work)
        acked = queue.ack(task)
        client.rpush(LOG, json.dumps({**run, "at": "end", "time": time.time(), "acked": acked}))


def test_work_queue_with_workers_sigkilled_mid_task(r: Any) -> None:
    """200 tasks, 4 worker processes; the test SIGKILLs a worker in the middle of a long task
    4 times (starting a replacement each time). Proves: every task is acked exactly once (one
    ack answered True per task, none False), none is lost (the queue is empty), the killed
    workers' tasks ran again (attempts 1, 2, ... in order) but only once their claim expired
    (server clock), and no task ever ran on two live workers at once (per task, the runs' wall
    clock intervals do not overlap; a killed run ends when the test reaped its worker)."""
    queue = _queue()
    ids = [queue.put({"n": n, "long": n % 25 == 0}) for n in range(TASKS)]
    workers: dict[int, Any] = {}

    def start_worker() -> None:
        worker = CHILDREN.Process(target=_work, args=(conf.CONNECTION,))
        worker.start()
        assert worker.pid is not None
        workers[worker.pid] = worker

    # pid: (its run, when SIGKILL was sent, when the test had reaped it)
    killed: dict[int, tuple[dict[str, Any], float, float]] = {}
    running: dict[int, dict[str, Any]] = {}  # pid: its run that started and has not ended
    seen = 0
    for _ in range(WORKERS):
        start_worker()
    deadline = time.monotonic() + LIMIT
    try:
        while queue.stats() != QueueStats(0, 0, 0, 0):
            assert time.monotonic() < deadline, f"the queue never emptied: {queue.stats()}"
            for raw in r.lrange(LOG, seen, -1):
                seen += 1
                record = json.loads(raw)
                if record["at"] == "start":
                    running[record["pid"]] = record
                else:
                    assert record["acked"], f"a live worker's claim was taken over: {record}"
                    running.pop(record["pid"], None)
            now = time.time()
            # A worker surely asleep in a long task for at least another LONG * 2/3 s.
            victims = [run for pid, run in running.items() if pid in workers
                       and run["work"] == LONG and run["time"] + LONG - now > LONG * 2 / 3]
            if victims and len(killed) < KILLS:
                victim = workers.pop(victims[0]["pid"])
                signalled_at = time.time()
                victim.kill()
                # A killed process needs the CPU to exit: on a loaded machine the reap can
                # come after its task's work would have ended (CI), never the signal.
                victim.join(LIMIT)
                killed[victims[0]["pid"]] = (victims[0], signalled_at, time.time())
                start_worker()
            time.sleep(0.01)
        r.set(STOP, 1)
        for worker in workers.values():
            worker.join(max(deadline - time.monotonic(), 0.1))
    finally:
        for worker in workers.values():
            if worker.is_alive():
                worker.kill()
                worker.join()
    assert [w.exitcode for w in workers.values()] == [0] * len(workers)
    assert len(killed) == KILLS

    # Nothing lost, nothing left: every task acked, none dead, no claim, no attempt count.
    assert queue.stats() == (0, 0, 0, 0)
    assert r.exists(*queue.keys[:6]) == 0
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    ends: dict[tuple[int, str, int], dict[str, Any]] = {}
    for record in _log(r):
        if record["at"] == "start":
            runs[record["task"]].append(record)
        else:
            ends[record["pid"], record["task"], record["attempts"]] = record
    assert sorted(runs, key=int) == ids
    kills: dict[tuple[int, str, int], float] = {}
    for pid, (run, signalled_at, reaped_at) in killed.items():
        # Killed while asleep in the task: its ack was never sent (no end below); its run
        # ended by the time the test had reaped it.
        assert signalled_at < run["time"] + run["work"], "the kill came after the work ended"
        kills[pid, run["task"], run["attempts"]] = reaped_at
    assert not kills.keys() & ends.keys()
    for task, task_runs in runs.items():
        for run in task_runs:
            at = (run["pid"], task, run["attempts"])
            if at in kills:
                run["end"] = kills[at]
            else:
                end = ends.pop(at)
                run["end"], run["acked"] = end["time"], end["acked"]
        task_runs.sort(key=lambda run: run["time"])
        # Acked exactly once, by its last run; the runs before were killed ones.
        assert [run.get("acked") for run in task_runs] == [None] * (len(task_runs) - 1) + [True]
        assert [run["attempts"] for run in task_runs] == list(range(1, len(task_runs) + 1))
        for before, after in itertools.pairwise(task_runs):
            assert before["pid"] in killed and before["pid"] != after["pid"]
            assert after["time"] >= before["end"], f"task {task} ran twice at once: {task_runs}"
            # Claimed again only once the first claim had expired (both on the server's clock).
            assert after["deadline"] - VISIBILITY >= before["deadline"] - 1e-6
    assert not ends  # every end belongs to a start
    killed_tasks = {run["task"] for run, _signalled, _reaped in killed.values()}
    assert all(len(runs[task]) > 1 for task in killed_tasks)
    assert sum(len(task_runs) for task_runs in runs.values()) == TASKS + KILLS


# -- VersionedCache: racing writers, one build, readers ---------------------------------------

CACHE, ENTRY = "catalog", "page"
VERSIONS, WRITERS, READERS, BUILDERS = 400, 4, 2, 2
BUILDS, BUILD_STARTED = "test:builds", "test:build-started"


def _version_race(connection: str, versions: list[list[int]]) -> None:
    """Writers (one per list of versions: each sets its versions in the given order, each
    again, then a lower version, reading each write back), readers polling get_versioned,
    and builders calling get_or_build. The writers wait until a build has started: the one
    build races them, its value built for "no version" and finished after they wrote."""
    setup_django(connection)
    client, cache = _client(), VersionedCache(CACHE)
    writing = threading.Event()
    writers_left = [len(versions)]
    lock = threading.Lock()

    def check(found: Versioned | None, at_least: int) -> int:
        assert found is not None and found.version >= at_least, (found, at_least)
        assert found.value == ("v", found.version), found
        return int(found.version)

    def writer(mine: list[int]) -> Callable[[], None]:
        def work() -> None:
            rng = random.Random()
            _wait_for(lambda: bool(client.exists(BUILD_STARTED)), "a build to start")
            results = []
            try:
                for version in mine:
                    for v in (version, version, rng.randint(1, version)):
                        stored = cache.set(ENTRY, ("v", v), version=v)
                        results.append([v, stored])
                        check(cache.get_versioned(ENTRY), v)  # this write or a newer one
            finally:
                with lock:
                    writers_left[0] -= 1
                    if not writers_left[0]:
                        writing.set()
            client.rpush(LOG, json.dumps({"writer": results}))

        return work

    def reader() -> None:
        last: int | None = None
        polls = 0
        while not writing.is_set() and polls < 100_000:
            polls += 1
            found = cache.get_versioned(ENTRY)
            if found is None:
                assert last is None, "the entry vanished"
                continue
            last = check(found, last or 0)  # never going back
        client.rpush(LOG, json.dumps({"reader": [polls, last]}))

    def build() -> tuple[str, int]:
        client.incr(BUILDS)
        client.set(BUILD_STARTED, 1)
        _wait_for(lambda: cache.get_versioned(ENTRY) is not None, "a writer's first set")
        return ("built", os.getpid())

    def builder() -> None:
        got = []
        last = 0
        for _ in range(20):
            value = cache.get_or_build(ENTRY, build, ttl=300)
            got.append(value)
            if value[0] == "v":
                assert value[1] >= last, (value, got)
                last = value[1]
            else:
                assert value == ("built", os.getpid()), value
            if writing.is_set():
                break
            time.sleep(0.005)
        client.rpush(LOG, json.dumps({"builder": got}))

    _threads_together(client, [writer(mine) for mine in versions]
                      + [reader] * READERS + [builder] * BUILDERS)


def test_versioned_cache_keeps_the_highest_version_under_racing_writers(r: Any) -> None:
    """Versions 1..400 shuffled over 4 processes x 4 writers, each write followed by the same
    write again and a write of a lower version, each read back; 4 x 2 readers and 4 x 2
    get_or_build callers race them, one build running while the first writes land. Proves: the
    entry ends with version 400 and its value; each version was stored at most once and each
    writer's successful versions only grew (no write replaced a newer or equal one); a writer
    always reads back its version or a newer one; readers never see a version go back, nor the
    entry vanish, nor a value that is not its version's; exactly one build ran and its value
    (built for "no version") was never stored."""
    cache = VersionedCache(CACHE)
    shuffled = random.Random(16).sample(range(1, VERSIONS + 1), VERSIONS)
    slices = [shuffled[i::PROCESSES * WRITERS] for i in range(PROCESSES * WRITERS)]
    _run_together(r, _version_race,
                  [(slices[p * WRITERS:(p + 1) * WRITERS],) for p in range(PROCESSES)])

    assert cache.get_versioned(ENTRY) == (("v", VERSIONS), VERSIONS)
    assert int(r.get(BUILDS) or 0) == 1
    log = _log(r)
    writes = [results for entry in log for results in entry.get("writer", [])]
    assert len(writes) == 3 * VERSIONS
    stored = Counter(v for v, ok in writes if ok)
    assert max(stored.values()) == 1 and stored[VERSIONS] == 1
    for entry in log:
        if "writer" in entry:
            mine = [v for v, ok in entry["writer"] if ok]
            assert mine == sorted(set(mine)), mine
    readers = [entry["reader"] for entry in log if "reader" in entry]
    assert len(readers) == PROCESSES * READERS
    builders = [entry["builder"] for entry in log if "builder" in entry]
    assert len(builders) == PROCESSES * BUILDERS
    assert sum(value[0] == "built" for got in builders for value in got) == 1
