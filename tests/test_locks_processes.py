"""Lock acceptance with real processes (tests/processes.py's children, each with its own Django
and Redis clients)."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis

from django_redislua.locks import Lock
from django_redislua.testing import CommandRecorder
from tests.processes import CHILDREN, setup_django
from tests.test_locks_fair import tries

pytestmark = pytest.mark.slow


def _increment_in_threads(threads: int, increments: int) -> None:
    setup_django()
    from django_redislua.connection import get_client

    client = get_client()

    def work() -> None:
        for _ in range(increments):
            with Lock("counter", timeout=10, blocking_timeout=60):
                value = int(client.get("counter") or 0)  # unprotected read-modify-write
                client.set("counter", value + 1)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()


def _record_tokens(acquisitions: int) -> None:
    setup_django()
    from django_redislua.connection import get_client

    client = get_client()
    for _ in range(acquisitions):
        with Lock("fenced", timeout=10, blocking_timeout=60) as lock:
            client.rpush("tokens", lock.token or 0)


def _run(target: object, args: tuple[int, ...], processes: int, limit: float) -> None:
    workers = [CHILDREN.Process(target=target, args=args) for _ in range(processes)]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + limit
    for worker in workers:
        worker.join(max(deadline - time.monotonic(), 0.1))
    alive = [w for w in workers if w.is_alive()]
    for worker in alive:
        worker.kill()
        worker.join()
    assert not alive, f"{len(alive)} workers still running after {limit}s"
    assert [w.exitcode for w in workers] == [0] * processes


def test_mutual_exclusion_4_processes_x_8_threads_x_100(r: redis.Redis) -> None:
    _run(_increment_in_threads, (8, 100), processes=4, limit=240)
    assert int(r.get("counter") or 0) == 3200


def test_mutual_exclusion_fails_without_the_lock(r: redis.Redis) -> None:
    """The counter test can fail: the same unprotected increments without a lock lose updates."""

    def work() -> None:
        for _ in range(200):
            value = int(r.get("unlocked") or 0)
            r.set("unlocked", value + 1)

    pool = [threading.Thread(target=work) for _ in range(8)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    assert int(r.get("unlocked") or 0) < 1600


def test_fencing_tokens_strictly_increase_across_1000_acquisitions(r: redis.Redis) -> None:
    _run(_record_tokens, (250,), processes=4, limit=240)
    tokens = [int(t) for t in r.lrange("tokens", 0, -1)]
    assert len(tokens) == 1000
    assert all(a < b for a, b in itertools.pairwise(tokens))


HOLDER = """
import os, sys, time
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
import django
django.setup()
from django_redislua.connection import get_client
from django_redislua.locks import Lock
lock = Lock("crash", timeout=float(sys.argv[1]), auto_renew=sys.argv[2] == "renew")
assert lock.acquire()
get_client().set("holder-ready", lock.token)
time.sleep(float(sys.argv[3]))
lock.release()
get_client().set("holder-done", 1)
"""


def _start_holder(r: redis.Redis, timeout: float, renew: bool,
                  work: float) -> subprocess.Popen[bytes]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(timeout), "renew" if renew else "plain", str(work)],
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    deadline = time.monotonic() + 30
    while not r.exists("holder-ready"):
        assert holder.poll() is None, "the holder process died"
        assert time.monotonic() < deadline, "the holder never acquired"
        time.sleep(0.02)
    return holder


def test_holder_killed_with_sigkill_frees_the_lock_after_its_ttl(r: redis.Redis) -> None:
    holder = _start_holder(r, timeout=1.0, renew=False, work=60)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(10)
    killed_at = time.monotonic()
    ttl = r.pttl("rl:lock:{crash}") / 1000
    assert 0 < ttl <= 1.0
    waiter = Lock("crash", timeout=5, blocking_timeout=5)
    with CommandRecorder(r) as recorder:
        assert waiter.acquire()
    waited = time.monotonic() - killed_at
    assert waited > ttl - 0.1  # not before the dead holder's lease ran out
    # Woken by the lease's end, not by polling: its first try, the one every wait begins with
    # once subscribed, and the one at the lease's end (one more when the server's millisecond
    # TTL ran out a moment after it). That it sleeps until that end, no later, is
    # tests/unit/test_lock_waits.py's (in virtual time: a bound on the time taken here would
    # fail on a loaded machine).
    sent = tries(recorder, "django_redislua.lock_acquire")
    assert 3 <= sent <= 4, sent
    assert waiter.token is not None and waiter.token > int(r.get("holder-ready") or 0)
    waiter.release()


def test_auto_renew_keeps_the_lock_for_3x_its_timeout(r: redis.Redis) -> None:
    # A 2 s lease, renewed every 2/3 s: with a 0.5 s one, a loaded CI machine (four test
    # workers on two cores) once left the holder's renewer unscheduled for the whole lease, and
    # the lock was rightly lost ("lease lost while held"). No renewer can outlast a stall of
    # its whole lease; when each renewal happens is tests/unit/test_lease.py's, in virtual time.
    holder = _start_holder(r, timeout=2.0, renew=True, work=6.0)
    started = time.monotonic()
    probe = Lock("crash", timeout=5, blocking=False)
    while not r.exists("holder-done") and time.monotonic() - started < 5.5:
        assert not probe.acquire(), "someone else got the lock while the holder was working"
        time.sleep(0.05)
    assert holder.wait(20) == 0
    assert r.exists("holder-done")
    assert time.monotonic() - started >= 5.5
    assert probe.acquire()
    # Nobody else acquired in between: the last token handed out was the holder's.
    assert probe.token is not None and probe.token > int(r.get("holder-ready") or 0)
    probe.release()
