"""Lock benchmark: hand-off latency and uncontended acquire+release, against peers, one run.

    .venv/bin/python benchmarks/bench_locks.py [--handoffs 50] [--cycles 2000]

Uses REDIS_URL if set, else starts its own loopback server (django_redislua.testing.RedisServer).
Peers in the same run: redis-py's ``Lock`` (default 0.1 s sleep between tries) and
python-redis-lock (BLPOP wake-up). Every run is bounded in count; figures are medians.

- hand-off: a waiter blocks on the lock; the holder releases; time from the start of the
  release call to the waiter's acquire returning, measured on one monotonic clock.
- uncontended: acquire then release of a free lock; round trips counted with MONITOR.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from django_redislua.testing import running_server


def setup_django(url: str) -> None:
    import django
    from django.conf import settings

    settings.configure(INSTALLED_APPS=["django_redislua"],
                       REDISLUA={"CONNECTION": url, "SOCKET_TIMEOUT": 5})
    django.setup()


# Each peer: (acquire, release) factories for a lock called name, blocking acquire.
Pair = tuple[Callable[[], Any], Callable[[], Any]]


def peers(client: Any) -> dict[str, Callable[[str], Pair]]:
    import redis_lock

    from django_redislua.locks import Lock

    def ours(name: str) -> Pair:
        lock = Lock(name, timeout=30)
        return lock.acquire, lock.release

    def redis_py(name: str) -> Pair:
        lock = client.lock(name, timeout=30, thread_local=False)  # released by another thread
        return lock.acquire, lock.release

    def python_redis_lock(name: str) -> Pair:
        lock = redis_lock.Lock(client, name, expire=30)
        return lock.acquire, lock.release

    return {"django-redislua Lock": ours, "redis-py Lock": redis_py,
            "python-redis-lock": python_redis_lock}


def handoff_ms(make: Callable[[str], Pair], trials: int) -> float:
    latencies = []
    for trial in range(trials):
        name = f"bench:handoff:{trial}"
        hold, release = make(name)
        hold()
        wait, done = make(name)
        acquired_at: list[float] = []

        def waiter(wait: Callable[[], Any] = wait, acquired_at: list[float] = acquired_at) -> None:
            wait()
            acquired_at.append(time.perf_counter())

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.03)  # the waiter is now blocked (subscribed, in BLPOP, or sleeping)
        released_at = time.perf_counter()
        release()
        thread.join(10)
        latencies.append((acquired_at[0] - released_at) * 1000)
        done()
    return statistics.median(latencies)


def uncontended_us(make: Callable[[str], Pair], cycles: int) -> float:
    timings = []
    for cycle in range(cycles):
        acquire, release = make(f"bench:free:{cycle % 50}")
        started = time.perf_counter()
        acquire()
        release()
        timings.append((time.perf_counter() - started) * 1_000_000)
    return statistics.median(timings)


def round_trips(client: Any, make: Callable[[str], Pair]) -> int:
    from django_redislua.testing import CommandRecorder

    acquire, release = make("bench:rt:warm")
    acquire()
    release()  # scripts loaded, connections open
    acquire, release = make("bench:rt")
    with CommandRecorder(client) as recorder:
        acquire()
        release()
    return len(recorder.commands)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--handoffs", type=int, default=50, help="hand-off trials per peer")
    parser.add_argument("--cycles", type=int, default=2000, help="uncontended cycles per peer")
    options = parser.parse_args()
    with running_server() as url:
        setup_django(url)
        from django_redislua.connection import get_client

        client = get_client()
        rows = []
        for label, make in peers(client).items():
            # redis-py sleeps 0.1 s between tries: fewer trials keep the run short.
            trials = min(options.handoffs, 20) if label == "redis-py Lock" else options.handoffs
            rows.append((label, handoff_ms(make, trials), uncontended_us(make, options.cycles),
                         round_trips(client, make)))
        ours = rows[0]
        print(f"Redis: {url}  hand-off trials: {options.handoffs}  cycles: {options.cycles}")
        print(f"{'peer':<22} {'hand-off ms':>12} {'vs ours':>8} {'acq+rel us':>11} "
              f"{'vs ours':>8} {'round trips':>12}")
        for label, handoff, cycle, trips in rows:
            print(f"{label:<22} {handoff:>12.3f} {handoff / ours[1]:>7.1f}x {cycle:>11.0f} "
                  f"{cycle / ours[2]:>7.2f}x {trips:>12}")


if __name__ == "__main__":
    main()
