"""Exactness under concurrency: 4 processes x 16 threads hit one key of a 100/m policy.

Every decision is one script, and Redis runs scripts one at a time, so exactly the quota is
admitted however the 64 callers interleave. The window algorithms and the concurrency slots run
on the server clock (a 100/m window cannot roll over during the test). A token bucket or GCRA of
100/m earns a new token every 600 ms, which a slow shared machine could legitimately see during
the run, so those two get one injected instant: the count is then exact by definition.
"""

from __future__ import annotations

import multiprocessing
import threading
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier as ProcessBarrier

import pytest

from django_redislua import Policy
from django_redislua.limiting import evaluate

PROCESSES = 4
THREADS = 16
HITS_PER_THREAD = 3  # 192 attempts for 100 admissions
INSTANT_US = 1_700_000_000_000_000


def make_policy(algorithm: str) -> Policy:
    if algorithm == "concurrency":
        return Policy("crowd", algorithm="concurrency", limit=100, timeout="1h")
    return Policy("crowd", rate="100/m", algorithm=algorithm)


def worker(
    algorithm: str, injected: bool, barrier: ProcessBarrier, results: Queue[int]
) -> None:
    policy = make_policy(algorithm)
    now_us = INSTANT_US if injected else None
    admitted = 0
    lock = threading.Lock()
    start = threading.Barrier(THREADS, timeout=30)

    def hammer() -> None:
        nonlocal admitted
        start.wait()
        mine = sum(
            evaluate([(policy, "one-key", 1)], now_us=now_us)[0].allowed
            for _ in range(HITS_PER_THREAD)
        )
        with lock:
            admitted += mine

    threads = [threading.Thread(target=hammer) for _ in range(THREADS)]
    barrier.wait(30)  # every process ready before any thread fires
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    results.put(admitted)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("algorithm", "injected"),
    [
        ("fixed_window", False),
        ("sliding_log", False),
        ("sliding_log", True),  # every entry in one microsecond: nonces keep them distinct
        ("token_bucket", True),
        ("gcra", True),
        ("concurrency", False),
    ],
)
def test_exactly_the_quota_is_admitted(algorithm: str, injected: bool) -> None:
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(PROCESSES)
    results = context.Queue()
    processes = [
        context.Process(target=worker, args=(algorithm, injected, barrier, results))
        for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    counts = [results.get(timeout=90) for _ in processes]
    for process in processes:
        process.join(30)
        assert process.exitcode == 0
    assert sum(counts) == 100
    if not injected:
        assert make_policy(algorithm).peek("one-key").remaining == 0
