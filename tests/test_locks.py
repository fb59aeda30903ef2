"""Lock: acquire/release/extend semantics, fencing, reentrancy, waking, inspection."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from django_redislua.locks import Lock, LockNotAcquired, LockNotOwned
from django_redislua.locks.inspect import LockInfo, force_release, scan_locks
from django_redislua.locks.lock import _Wait
from django_redislua.protocol import Call, Spawn, unsent
from django_redislua.testing import CommandRecorder

pytestmark = pytest.mark.topologies


def _scan_all(match: str, count: int = 100) -> list[LockInfo]:
    """Every page of ``scan_locks`` (on a cluster one page reads one primary, so a first page
    alone may miss a lock held on another)."""
    found: list[LockInfo] = []
    cursor = 0
    for _page in range(1000):
        cursor, page = scan_locks(cursor, match=match, count=count)
        found.extend(page)
        if cursor == 0:
            return found
    raise AssertionError(f"scan_locks({match!r}) did not finish within 1000 pages")


def test_acquire_release_and_fencing_tokens_grow(r: redis.Redis) -> None:
    tokens = []
    for _ in range(3):
        lock = Lock("job", timeout=5)
        assert lock.acquire()
        assert r.hget("rl:lock:{job}", "owner") == lock.owner.encode()
        tokens.append(lock.token)
        lock.release()
        assert not r.exists("rl:lock:{job}")
    assert all(isinstance(t, int) and t > 0 for t in tokens)
    assert tokens == sorted(set(tokens))  # strictly increasing


def test_uncontended_acquire_release_is_two_round_trips(r: redis.Redis) -> None:
    with Lock("warm", timeout=5):  # loads both scripts after the fixture's SCRIPT FLUSH
        pass
    lock = Lock("rt", timeout=5)
    with CommandRecorder(r) as recorder:
        assert lock.acquire()
        lock.release()
    assert recorder.commands == ["EVALSHA", "EVALSHA"]
    assert lock.token is not None and lock.token > 0


def test_non_owner_release_and_extend_are_refused(r: redis.Redis) -> None:
    holder = Lock("owned", timeout=5)
    intruder = Lock("owned", timeout=5, blocking=False)
    assert holder.acquire()
    assert not intruder.acquire()
    with pytest.raises(LockNotOwned):
        intruder.release()
    with pytest.raises(LockNotOwned):
        intruder.extend(10)
    assert r.hget("rl:lock:{owned}", "owner") == holder.owner.encode()
    holder.release()
    with pytest.raises(LockNotOwned):
        holder.release()


def test_release_works_from_another_thread() -> None:
    lock = Lock("cross-thread", timeout=5)
    assert lock.acquire()
    thread = threading.Thread(target=lock.release)
    thread.start()
    thread.join()
    assert not lock.locked()


def test_extend_adds_or_replaces_the_lease(r: redis.Redis) -> None:
    lock = Lock("ext", timeout=2)
    lock.acquire()
    lock.extend(10)
    assert 11_000 < r.pttl("rl:lock:{ext}") <= 12_000
    lock.extend(3, replace_ttl=True)
    assert 2_000 < r.pttl("rl:lock:{ext}") <= 3_000
    lock.release()


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Lock("x", timeout=0)
    with pytest.raises(ValueError):
        Lock("x", timeout=-1)


def test_reentrant_counts_per_owner(r: redis.Redis) -> None:
    lock = Lock("re", timeout=5, reentrant=True)
    with lock:
        with lock:
            assert r.hget("rl:lock:{re}", "count") == b"2"
            assert lock.token == int(r.hget("rl:lock:{re}", "token") or 0)  # re-entry keeps it
        assert r.hget("rl:lock:{re}", "count") == b"1"
    assert not r.exists("rl:lock:{re}")


# -- the holder's own count of its holds: the protocols driven by hand, no Redis ------------------

def release_args(call: Call) -> tuple[Any, ...]:
    """The ARGV of a release call (lock_release.lua): after EVALSHA/FCALL, its name, 4 keys."""
    return tuple(call.command[3 + 4:])


def test_a_release_gives_back_its_hold_by_id_with_the_uncounted_calls() -> None:
    lock = Lock("holds", timeout=30, reentrant=True)
    lock._held(7, 0.0, "took")
    lock._held(7, 0.0, "again")  # a re-entry: the same token
    lock._held(7, 0.0, "again")  # the same wait's reply again (a confirm sent twice)
    assert lock._holds == ["took", "again"]
    lock._uncounted.add("lost")  # an acquire whose reply never arrived
    release = lock._releasing()
    args = release_args(next(release))
    assert args[6] == "again" and args[8:] == ("lost",)
    with pytest.raises(redis.TimeoutError):
        release.throw(redis.TimeoutError("its reply was lost"))
    # Not counted any more, whatever happened on the server: the next release settles it.
    assert lock._holds == ["took"] and lock._uncounted == {"lost", "again"}
    release = lock._releasing()
    args = release_args(next(release))
    assert args[6] == "took" and sorted(args[8:]) == ["again", "lost"]
    with pytest.raises(StopIteration):
        release.send(0)
    assert lock._holds == [] and lock._uncounted == set()


def test_a_new_token_is_a_new_acquisition() -> None:
    lock = Lock("holds-new", timeout=30, reentrant=True)
    lock._held(7, 0.0, "took")
    lock._held(7, 0.0, "again")
    lock._held(9, 0.0, "later")  # the lease ran out meanwhile: taken anew
    assert lock._holds == ["later"] and lock.token == 9


def failed_acquire(lock: Lock, failure: BaseException) -> None:
    """An acquire whose first call fails with ``failure``; its give-back spawned, not run."""
    acquire = lock._acquire(False, None)
    assert isinstance(next(acquire), Call)
    assert isinstance(acquire.throw(failure), Spawn)  # the give-back, in the background
    with pytest.raises(type(failure)):
        acquire.send(None)


def test_an_acquire_that_may_have_reached_redis_is_uncounted_until_settled() -> None:
    lock = Lock("holds-lost", timeout=30, reentrant=True)
    failed_acquire(lock, unsent(redis.ConnectionError("refused")))  # never sent: holds nothing
    assert lock._uncounted == set()
    failed_acquire(lock, redis.TimeoutError("its reply was lost"))
    (lost,) = lock._uncounted
    wait = _Wait(lock, None)
    wait.id = lost
    give_back = lock._giving_back(wait)
    assert isinstance(next(give_back), Call)
    with pytest.raises(StopIteration):
        give_back.send([0, 0, 0])  # it landed: nothing left to settle
    assert lock._uncounted == set()


def test_the_next_acquire_settles_the_uncounted_calls() -> None:
    lock = Lock("holds-next", timeout=30)
    lock._uncounted.add("lost")
    acquire = lock._acquire(False, None)
    call = next(acquire)
    assert isinstance(call, Call) and tuple(call.command[3 + 4 + 10:]) == ("lost",)
    with pytest.raises(StopIteration):
        acquire.send([1, 7, 1])  # taken, with token 7
    assert lock._uncounted == set() and lock._depth == 1


def test_non_reentrant_second_acquire_by_owner_waits() -> None:
    lock = Lock("nre", timeout=5)
    assert lock.acquire()
    assert not lock.acquire(blocking=False)
    lock.release()


def test_context_manager_raises_when_not_acquired_in_time() -> None:
    holder = Lock("busy", timeout=5)
    holder.acquire()
    started = time.monotonic()
    with pytest.raises(LockNotAcquired), Lock("busy", timeout=5, blocking_timeout=0.2):
        pass
    assert 0.15 < time.monotonic() - started < 1.0
    holder.release()


def test_waiter_is_woken_by_release_not_by_the_lease() -> None:
    holder = Lock("handoff", timeout=30)
    holder.acquire()
    acquired_at: list[float] = []

    def wait() -> None:
        waiter = Lock("handoff", timeout=30, blocking_timeout=10)
        assert waiter.acquire()
        acquired_at.append(time.monotonic())
        waiter.release()

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.3)
    released_at = time.monotonic()
    holder.release()
    thread.join(5)
    assert acquired_at and acquired_at[0] - released_at < 0.1


def test_waiter_takes_over_when_the_lease_expires() -> None:
    holder = Lock("expiring", timeout=0.3)
    holder.acquire()  # never released: as if its process died
    started = time.monotonic()
    waiter = Lock("expiring", timeout=5, blocking_timeout=5)
    assert waiter.acquire()
    assert 0.2 < time.monotonic() - started < 1.0
    assert holder.token is not None and waiter.token is not None
    assert waiter.token > holder.token


def test_auto_renew_keeps_a_lock_beyond_its_timeout_and_stops_on_release(r: redis.Redis) -> None:
    lock = Lock("renewed", timeout=0.3, auto_renew=True)
    with lock:
        time.sleep(1.0)
        assert lock.owned()
        assert not lock.lost
    assert not r.exists("rl:lock:{renewed}")
    time.sleep(0.2)
    assert not r.exists("rl:lock:{renewed}")


def test_auto_renew_failure_sets_lost() -> None:
    # A lease a stalled test process cannot outlast before the force release (0.3 s could:
    # seen once on a loaded machine); then a checker, not a sleep, for the renewer's verdict.
    lock = Lock("lost", timeout=2, auto_renew=True)
    lock.acquire()
    assert force_release("lost")
    deadline = time.monotonic() + 5
    while not lock.lost:
        assert time.monotonic() < deadline, "the renewer never noticed the lock was lost"
        time.sleep(0.02)
    with pytest.raises(LockNotOwned):
        lock.release()


def test_decorator_runs_each_call_under_the_lock(r: redis.Redis) -> None:
    seen = []

    @Lock("decorated", timeout=5)
    def job(x: int) -> int:
        seen.append(r.hget("rl:lock:{decorated}", "owner"))
        return x * 2

    assert job(2) == 4
    assert job(3) == 6
    assert seen[0] and seen[1] and seen[0] != seen[1]
    assert not r.exists("rl:lock:{decorated}")


def test_hostile_names_are_bounded_and_share_one_hash_tag(r: redis.Redis) -> None:
    lock = Lock("a{b}\n" + "x" * 500, timeout=5)
    lock.acquire()
    keys = sorted(k.decode() for k in r.scan_iter("rl:lock:*"))
    assert len(keys) == 2
    tags = {k[k.index("{"):k.index("}") + 1] for k in keys}
    assert len(tags) == 1 and len(next(iter(tags))) < 40
    lock.release()


def test_scan_locks_and_force_release(r: redis.Redis) -> None:
    held = []
    for name in ("report:daily", "report:weekly", "other"):
        lock = Lock(name, timeout=30, reentrant=True)
        lock.acquire()
        held.append(lock)
    held[0].acquire()
    found = _scan_all("report", count=1)  # many small pages
    by_name = {info.name: info for info in found}
    assert set(by_name) == {"report:daily", "report:weekly"}
    daily = by_name["report:daily"]
    assert daily.owner == held[0].owner
    assert daily.reentry_count == 2
    assert daily.fencing_token == held[0].token
    assert daily.ttl is not None and 29 < daily.ttl <= 30
    assert daily.waiters == 0
    assert {i.name for i in scan_locks(match="report:w*")[1]} <= {"report:weekly"}
    assert {i.name for i in _scan_all("report:w*")} == {"report:weekly"}
    assert force_release("report:daily")
    assert not force_release("report:daily")
    assert not r.exists("rl:lock:{report:daily}")
    with pytest.raises(LockNotOwned):
        held[0].release()


def test_scan_locks_counts_waiters_and_force_release_wakes_them() -> None:
    Lock("contended", timeout=30).acquire()
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda: results.append(
            Lock("contended", timeout=30, blocking_timeout=10).acquire()))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    waiters = 0
    while time.monotonic() < deadline and waiters < 2:
        (info,) = _scan_all("contended")
        waiters = info.waiters
        time.sleep(0.05)
    assert waiters == 2
    started = time.monotonic()
    assert force_release("contended")
    deadline = time.monotonic() + 5
    while len(results) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert results == [True]
    assert time.monotonic() - started < 1.0
    force_release("contended")
    for thread in threads:
        thread.join(5)
    assert results == [True, True]


def test_redislua_locks_command_lists_and_releases() -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command

    out = StringIO()
    call_command("redislua_locks", stdout=out)
    assert out.getvalue().strip() == "no locks held"
    lock = Lock("cmd:job", timeout=30)
    lock.acquire()
    out = StringIO()
    call_command("redislua_locks", stdout=out)
    header, row = out.getvalue().strip().splitlines()
    assert header.split() == ["NAME", "OWNER", "TTL", "TOKEN", "COUNT", "WAITERS"]
    assert row.split()[:2] == ["cmd:job", lock.owner]
    assert row.split()[3:] == [str(lock.token), "1", "0"]
    out = StringIO()
    call_command("redislua_locks", release="cmd:job", stdout=out)
    assert "released cmd:job" in out.getvalue()
    assert not lock.locked()
    with pytest.raises(CommandError):
        call_command("redislua_locks", release="cmd:job")
