"""Direct hand-off: a release gives the lock to a queued waiter, announced on the channel."""

import asyncio
import threading
import time

from django_redislua.locks import Lock
from django_redislua.scripts import get_script


def queue_size(r, lock):
    return r.zcard(lock.keys.sub("queue"))


def blocked_waiter(lock, **kwargs):
    result = {}

    def run():
        result["acquired"] = lock.acquire(**kwargs)
        result["at"] = time.perf_counter()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def wait_for_queue(r, lock, size=1, seconds=5.0):
    deadline = time.monotonic() + seconds
    while queue_size(r, lock) < size:
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.005)


def test_release_hands_the_lock_to_the_waiter_without_an_acquire_round_trip(r, recorder):
    holder, waiter = Lock("h", timeout=30), Lock("h", timeout=30)
    assert holder.acquire()
    holder.release()  # scripts loaded: only the hand-off itself is recorded below
    assert holder.acquire()
    thread, result = blocked_waiter(waiter)
    wait_for_queue(r, waiter)
    with recorder:
        holder.release()
        thread.join(5)
    assert result["acquired"] and waiter.token == holder.token + 1
    assert recorder.commands.count("EVALSHA") == 1  # the release; the waiter sent none
    assert "PUBLISH" in recorder.script_commands
    assert r.hget(waiter.keys.base, "owner").decode() == waiter.owner
    assert r.pttl(waiter.keys.base) > 25_000  # the heir's own lease
    waiter.release()
    assert not waiter.locked()


def test_a_missed_grant_message_is_found_by_the_next_retry(r):
    holder, heir, other = (Lock("m", timeout=30) for _ in range(3))
    assert holder.acquire()
    assert heir._attempt(stay_ms=5000) is not None  # queued, but not listening
    holder.release()  # hands over; the message goes nowhere
    assert not other.acquire(blocking=False)
    assert heir._attempt(stay_ms=5000) is None
    assert heir.token == holder.token + 1 and heir.owned()


def test_a_waiter_that_times_out_leaves_the_queue_and_gets_nothing(r):
    holder, waiter = Lock("t", timeout=30), Lock("t", timeout=30)
    assert holder.acquire()
    assert not waiter.acquire(blocking_timeout=0.2)
    assert queue_size(r, waiter) == 0
    holder.release()
    assert not holder.locked()  # no hand-off to a waiter that gave up


def test_a_grant_arriving_at_the_deadline_is_taken_by_the_withdrawal(r):
    holder, heir = Lock("d", timeout=30), Lock("d", timeout=30)
    assert holder.acquire()
    assert heir._attempt(stay_ms=5000) is not None
    holder.release()
    keys, args = heir._withdraw_call()
    assert heir._took(get_script("django_redislua.lock_withdraw")(keys=keys, args=args)) is None
    assert heir.owned() and queue_size(r, heir) == 0


def test_stale_registrations_are_skipped(r):
    holder, stale = Lock("s", timeout=30), Lock("s", timeout=30)
    assert holder.acquire()
    assert stale._attempt(stay_ms=1) is not None
    time.sleep(0.01)
    holder.release()
    assert not holder.locked()


def test_reentry_after_a_hand_off_counts(r):
    holder, heir = Lock("re", timeout=30), Lock("re", timeout=30, reentrant=True)
    assert holder.acquire()
    thread, result = blocked_waiter(heir)
    wait_for_queue(r, heir)
    holder.release()
    thread.join(5)
    assert result["acquired"]
    assert heir.acquire(blocking=False)  # re-enter: two holds
    heir.release()
    assert heir.owned()
    heir.release()
    assert not heir.locked()


def test_hand_off_goes_to_one_waiter_at_a_time(r):
    holder = Lock("q", timeout=30)
    assert holder.acquire()
    waiters = [Lock("q", timeout=30) for _ in range(3)]
    threads = [blocked_waiter(w, blocking_timeout=10) for w in waiters]
    wait_for_queue(r, holder, size=3)
    holder.release()
    tokens = []
    released: set[int] = set()
    deadline = time.monotonic() + 10
    while len(released) < 3:
        assert time.monotonic() < deadline
        held = [i for i, (_t, result) in enumerate(threads)
                if result.get("acquired") and i not in released]
        assert len(held) <= 1, "two waiters hold the lock at once"
        if held:
            owner = waiters[held[0]]
            tokens.append(owner.token)
            owner.release()
            released.add(held[0])
        time.sleep(0.002)
    assert tokens == [holder.token + 1, holder.token + 2, holder.token + 3]


async def test_async_hand_off_and_cancellation_leave_no_registration(r):
    holder, waiter = Lock("a", timeout=30), Lock("a", timeout=30)
    assert await holder.aacquire()
    task = asyncio.ensure_future(waiter.aacquire())
    for _ in range(500):
        if queue_size(r, waiter):
            break
        await asyncio.sleep(0.01)
    await holder.arelease()
    assert await asyncio.wait_for(task, 5) and waiter.token == holder.token + 1
    await waiter.arelease()

    assert await holder.aacquire()
    cancelled = Lock("a", timeout=30)
    task = asyncio.ensure_future(cancelled.aacquire())
    for _ in range(500):
        if queue_size(r, cancelled):
            break
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    for _ in range(500):  # the background withdrawal
        if not queue_size(r, cancelled):
            break
        await asyncio.sleep(0.01)
    assert queue_size(r, cancelled) == 0
    await holder.arelease()
    assert not await holder.alocked()


def test_a_thread_keeps_its_subscriber_connection_between_waits(r, recorder):
    holder = Lock("k", timeout=30)
    assert holder.acquire()
    waiter = Lock("k", timeout=30)
    assert not waiter.acquire(blocking_timeout=0.05)  # opens this thread's subscriber
    with recorder:
        assert not waiter.acquire(blocking_timeout=0.05)
    assert "SUBSCRIBE" in recorder.commands and "UNSUBSCRIBE" in recorder.commands
    assert "CLIENT" not in recorder.commands and "HELLO" not in recorder.commands
    holder.release()
    assert waiter.acquire(blocking_timeout=1)  # the kept connection still delivers
