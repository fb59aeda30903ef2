"""The lock's promises under the ways it used to break: first come first served, a claim window
for dead, stopped and departed waiters, grants that belong to one wait, withdrawal on every way
out of a wait, cancellation of a reentrant aacquire. Each runs on a single node and on the real
6-node cluster, sync and asyncio where both exist."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings
from redis.client import PubSub

from django_redislua.atransport import arun
from django_redislua.connection import get_client
from django_redislua.locks import Lock, LockNotOwned, LockUnavailable, Semaphore
from django_redislua.locks.lock import _Wait
from django_redislua.protocol import Mailbox
from django_redislua.scripts import get_script
from django_redislua.testing import CommandRecorder
from django_redislua.transport import run
from tests.test_lost_replies import PATIENT, owner_of

WINDOW = 0.3  # the claim window these tests run with (the default is 1 s)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(params=["single", pytest.param("cluster", marks=pytest.mark.cluster)])
def where(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test against the single test server, then against the 6-node cluster."""
    if request.param == "single":
        with override_settings(REDISLUA={**settings.REDISLUA, "LOCK_CLAIM_WINDOW": WINDOW}):
            yield "single"
        return
    cluster = request.getfixturevalue("redis_cluster")
    with override_settings(REDISLUA={"CONNECTION": cluster.url, "LOCK_CLAIM_WINDOW": WINDOW}):
        get_client().flushall()
        yield "cluster"


@pytest.fixture
def patient(where: str) -> Iterator[str]:
    """The topology with timeouts a loaded machine cannot reach (``PATIENT``), for tests of
    what happens, not of how long it may take."""
    with override_settings(REDISLUA={**settings.REDISLUA, **PATIENT}):
        yield where


def queued(lock: Lock) -> int:
    return int(get_client().zcard(lock.keys.sub("queue")))


def until(condition: Callable[[], bool], seconds: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


async def auntil(condition: Callable[[], bool], seconds: float = 5.0,
                 what: str = "condition") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


class Waiter(threading.Thread):
    """A thread blocked in ``lock.acquire(**kwargs)``; records when (and whether) it got it,
    holds it ``hold`` seconds, then releases (or keeps it with hold=None)."""

    def __init__(self, lock: Lock, order: list[str] | None = None, label: str = "",
                 hold: float | None = 0.0, **kwargs: Any) -> None:
        super().__init__(daemon=True)
        self.lock, self.order, self.label, self.hold, self.kwargs = lock, order, label, hold, kwargs
        self.acquired: bool | None = None
        self.at = 0.0

    def run(self) -> None:
        self.acquired = self.lock.acquire(**self.kwargs)
        self.at = time.monotonic()
        if self.acquired and self.order is not None:
            self.order.append(self.label)
        if self.acquired and self.hold is not None:
            time.sleep(self.hold)
            self.lock.release()


def queue_behind(lock: Lock, waiter: Waiter, size: int) -> Waiter:
    waiter.start()
    until(lambda: queued(lock) >= size, what=f"{waiter.label or 'the waiter'} to queue")
    return waiter


# -- hand-off ---------------------------------------------------------------------------------

def test_a_release_offers_the_lock_and_the_heir_confirms_with_one_call(where: str) -> None:
    holder, heir = Lock("h", timeout=30), Lock("h", timeout=30)
    # Every script loaded, as redislua_preload leaves a deployment: only the hand-off is
    # recorded below.
    call_command("redislua_preload", stdout=StringIO())
    assert holder.acquire()
    waiter = queue_behind(holder, Waiter(heir, hold=None), 1)
    client = get_client()
    recorder = CommandRecorder(client) if where == "single" else None
    if recorder:
        recorder.__enter__()
    released_at = time.monotonic()
    holder.release()
    waiter.join(5)
    if recorder:
        recorder.__exit__(None, None, None)
        assert recorder.commands.count("EVALSHA") == 2  # the release, the heir's confirmation
    assert waiter.acquired and waiter.at - released_at < WINDOW
    assert heir.token is not None and holder.token is not None and heir.token > holder.token
    assert client.hget(heir.keys.base, "claim") is None
    assert client.pttl(heir.keys.base) > 25_000  # confirmed: the heir's own lease runs
    heir.release()
    assert not heir.locked()


def heard_grant(holder: Lock, heir: Lock, inbox: str) -> _Wait:
    """A wait of ``heir`` queued behind ``holder`` with inbox ``inbox`` (nobody listens there),
    then the release's hand-off to it, heard as the heir would hear it."""
    wait = _Wait(heir, time.monotonic() + 5.0)
    wait.on_inbox(Mailbox(None, "", inbox, True))
    assert run(heir._attempt(wait, True)) is not None  # queued
    holder.release()
    token = get_client().hget(heir.keys.base, "token")
    assert token is not None
    assert wait.on_message(f"granted {wait.id} {int(token)} {int(WINDOW * 1000)}") is None
    assert wait.granted
    return wait


def test_a_confirm_sent_again_after_a_lost_reply_changes_nothing(where: str) -> None:
    holder, heir = Lock("confirm-again", timeout=30), Lock("confirm-again", timeout=30)
    assert holder.acquire()
    wait = heard_grant(holder, heir, "again")
    assert run(heir._attempt(wait, True)) is None and not wait.granted  # confirmed
    token = heir.token
    wait.granted = True  # its reply was lost: the same confirm goes out again
    assert run(heir._attempt(wait, True)) is None
    assert heir.token == token and heir._depth == 1
    client = get_client()
    assert client.hget(heir.keys.base, "claim") is None
    assert client.pttl(heir.keys.base) > 25_000
    heir.release()
    assert not heir.locked()


@pytest.mark.parametrize("taker", ["another lock", "another acquire of the same lock"])
def test_a_confirm_after_the_claim_ran_out_takes_nothing_and_the_heir_queues_again(
        where: str, taker: str) -> None:
    """The heir heard its grant but confirms after the claim window (it was paused): the lock
    went to another meanwhile (a grant belongs to its wait, so even another acquire of the same
    Lock object counts as another). The confirm takes nothing, and the heir's next try is a
    whole one again: queued anew, and handed the lock by the next release."""
    holder, heir = Lock("confirm-late", timeout=30), Lock("confirm-late", timeout=30)
    other = heir if taker == "another acquire of the same lock" else Lock("confirm-late", 30)
    assert holder.acquire()
    wait = heard_grant(holder, heir, "late")
    time.sleep(WINDOW + 0.1)  # the claim runs out unconfirmed
    assert other.acquire(blocking=False)
    token = other.token
    assert run(heir._attempt(wait, True)) is not None  # the confirm: nothing taken
    assert not wait.granted and other.owned() and other.token == token
    assert run(heir._attempt(wait, True)) is not None  # a whole try: queued behind `other`
    assert queued(holder) == 1
    other.release()
    assert run(heir._attempt(wait, True)) is None  # the next hand-off is the heir's
    assert heir.owned() and heir.token is not None and token is not None and heir.token > token
    heir.release()
    assert not heir.locked()


@pytest.mark.parametrize("health_checks", [False, True])
def test_the_heir_reads_its_grant_off_the_connection_unless_it_checks_its_health(
        monkeypatch: pytest.MonkeyPatch, health_checks: bool) -> None:
    """A kept inbox's messages are read straight off its connection (not through
    PubSub.get_message); a connection with health checks (redis-py answers their PINGs in
    get_message) is read through redis-py."""
    url = settings.REDISLUA["CONNECTION"]
    if health_checks:
        url += ("&" if "?" in url else "?") + "health_check_interval=30"
    through_redis_py: list[float] = []
    read = PubSub.get_message

    def get_message(self: PubSub, *args: Any, **kwargs: Any) -> Any:
        through_redis_py.append(time.monotonic())
        return read(self, *args, **kwargs)

    monkeypatch.setattr(PubSub, "get_message", get_message)
    with override_settings(REDISLUA={**settings.REDISLUA, "CONNECTION": url,
                                     "LOCK_CLAIM_WINDOW": WINDOW}):
        holder, heir = Lock("read-off", timeout=30), Lock("read-off", timeout=30)
        assert holder.acquire()
        waiter = queue_behind(holder, Waiter(heir, hold=None, blocking_timeout=10), 1)
        holder.release()
        waiter.join(5)
        assert waiter.acquired and heir.owned()
        heir.release()
    assert bool(through_redis_py) == health_checks


def test_a_waiter_whose_subscription_is_killed_fails_cleanly(r: Any) -> None:
    """The heir's pub/sub connection is closed by the server mid-wait (CLIENT KILL): read
    through redis-py again, the failure is what it always was (the client's retry policy, none
    here), so the wait ends with LockUnavailable and withdraws: nothing of it stays queued, and
    the next release frees the lock for anyone."""
    with override_settings(REDISLUA={**settings.REDISLUA, "LOCK_CLAIM_WINDOW": WINDOW}):
        holder, heir = Lock("killed-inbox", timeout=30), Lock("killed-inbox", timeout=30)
        assert holder.acquire()
        failures: list[BaseException] = []

        def wait() -> None:
            try:
                heir.acquire(blocking_timeout=10)
            except BaseException as exc:
                failures.append(exc)

        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        until(lambda: queued(holder) == 1, what="the heir to queue")
        assert int(r.execute_command("CLIENT", "KILL", "TYPE", "pubsub")) >= 1
        thread.join(5)
        assert [type(failure) for failure in failures] == [LockUnavailable]
        until(lambda: queued(holder) == 0, what="the withdrawal")
        holder.release()
        assert not holder.locked() and heir._depth == 0


def inboxes() -> int:
    """Inbox channels subscribed on every primary (PUBSUB CHANNELS asks one node)."""
    from django_redislua.connection import primary_nodes

    return sum(len(node.pubsub_channels("rl:inbox:*")) for _, node in primary_nodes())


def test_a_hand_off_wakes_only_its_heir(where: str) -> None:
    holder = Lock("only", timeout=30)
    assert holder.acquire()
    first = queue_behind(holder, Waiter(Lock("only", timeout=30), hold=None), 1)
    second = queue_behind(holder, Waiter(Lock("only", timeout=30), hold=None,
                                         blocking_timeout=10), 2)
    client = get_client()
    # Nobody listens on the lock's channel: each waiting thread has an inbox of its own.
    assert sum(int(n) for _, n in client.pubsub_numsub(holder.keys.channel)) == 0
    until(lambda: inboxes() >= 2, what="both inboxes")
    recorder = CommandRecorder(client) if where == "single" else None
    if recorder:
        recorder.__enter__()
    holder.release()
    first.join(5)
    if recorder:
        recorder.__exit__(None, None, None)
        published = [str(e["command"]) for e in recorder.entries
                     if str(e["command"]).upper().startswith("PUBLISH")]
        # One message, to the heir's inbox: the second waiter is not woken (it looks again
        # only when its claim-window timer fires).
        assert len(published) == 1 and "rl:inbox:" in published[0]
    assert first.acquired and second.is_alive() and queued(holder) == 1
    first.lock.release()
    second.join(5)
    assert second.acquired
    second.lock.release()


async def test_async_a_hand_off_wakes_only_its_heir(where: str) -> None:
    holder = Lock("aonly", timeout=30)
    assert await holder.aacquire()
    first, second = Lock("aonly", timeout=30), Lock("aonly", timeout=30)
    first_task = asyncio.ensure_future(first.aacquire())
    await auntil(lambda: queued(holder) >= 1)
    second_task = asyncio.ensure_future(second.aacquire(blocking_timeout=10))
    await auntil(lambda: queued(holder) >= 2)
    recorder = CommandRecorder(get_client()) if where == "single" else None
    if recorder:
        recorder.__enter__()
    await holder.arelease()
    assert await asyncio.wait_for(first_task, 5)
    if recorder:
        recorder.__exit__(None, None, None)
        published = [str(e["command"]) for e in recorder.entries
                     if str(e["command"]).upper().startswith("PUBLISH")]
        assert len(published) == 1 and "rl:inbox:" in published[0]
    assert not second_task.done() and queued(holder) == 1
    await first.arelease()
    assert await asyncio.wait_for(second_task, 5)
    await second.arelease()


def test_a_thread_keeps_its_inbox_from_one_wait_to_the_next(where: str) -> None:
    holder, lock = Lock("kept", timeout=30), Lock("kept", timeout=30)
    client = get_client()
    recorder = CommandRecorder(client) if where == "single" else None
    results: list[bool] = []
    release_next = threading.Event()

    def waits_twice() -> None:
        for _ in range(2):
            results.append(lock.acquire(blocking_timeout=5))
            lock.release()
            release_next.wait(5)

    assert holder.acquire()
    if recorder:
        recorder.__enter__()
    thread = threading.Thread(target=waits_twice, daemon=True)
    thread.start()
    until(lambda: queued(holder) == 1, what="the first wait")
    holder.release()
    until(lambda: len(results) == 1, what="the first acquisition")
    assert holder.acquire()
    release_next.set()
    until(lambda: queued(holder) == 1, what="the second wait")
    holder.release()
    thread.join(5)
    if recorder:
        recorder.__exit__(None, None, None)
        assert recorder.commands.count("SUBSCRIBE") == 1
        assert "UNSUBSCRIBE" not in recorder.commands
    assert results == [True, True]


def test_a_stale_grant_in_a_kept_inbox_wakes_nobody(where: str) -> None:
    from django_redislua.transport import get_transport

    holder = Lock("stale-grant", timeout=30)
    assert holder.acquire()
    assert not Lock("stale-grant", timeout=30).acquire(blocking_timeout=0.05)  # inbox kept now
    inbox = get_transport()._local.inbox.channel
    # A grant to an earlier wait of this thread, never read (its wait had ended): still queued
    # in the inbox when the thread waits again.
    get_client().publish(inbox, f"granted {'0' * 16} 1 {int(WINDOW * 1000)}")
    recorder = CommandRecorder(get_client()) if where == "single" else None
    if recorder:
        recorder.__enter__()
    assert not Lock("stale-grant", timeout=30).acquire(blocking_timeout=WINDOW * 0.8)
    if recorder:
        recorder.__exit__(None, None, None)
        # The first try, the queued try, the try at the deadline, the withdrawal: the stale
        # grant caused no try.
        assert recorder.commands.count("EVALSHA") == 4
    assert queued(holder) == 0
    holder.release()


def test_waiters_are_served_in_arrival_order_whatever_their_timeouts(where: str) -> None:
    holder = Lock("fifo", timeout=30)
    assert holder.acquire()
    order: list[str] = []
    # The old queue ordered by registration expiry: the short timeouts jumped ahead and a
    # waiter without a deadline came last. Arrival order is what each gets now.
    waiters = [
        queue_behind(holder, Waiter(Lock("fifo", timeout=30), order, label, 0.01,
                                    blocking_timeout=timeout), size)
        for size, (label, timeout) in enumerate(
            [("no-deadline", None), ("10s", 10), ("2s", 2), ("1s", 1.5)], start=1)
    ]
    holder.release()
    for waiter in waiters:
        waiter.join(10)
    assert order == ["no-deadline", "10s", "2s", "1s"]


async def test_async_waiters_are_served_in_arrival_order(where: str) -> None:
    holder = Lock("afifo", timeout=30)
    assert await holder.aacquire()
    order: list[str] = []

    async def wait(label: str, timeout: float | None) -> None:
        lock = Lock("afifo", timeout=30, blocking_timeout=timeout)
        assert await lock.aacquire()
        order.append(label)
        await asyncio.sleep(0.01)
        await lock.arelease()

    tasks = []
    for size, (label, timeout) in enumerate([("none", None), ("5s", 5), ("1s", 1.5)], start=1):
        tasks.append(asyncio.ensure_future(wait(label, timeout)))
        await auntil(lambda size=size: queued(holder) >= size)  # type: ignore[misc]
    await holder.arelease()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert order == ["none", "5s", "1s"]


def park(lock: Lock) -> _Wait:
    """A waiter that queues and then never reads its messages: a process that died, was
    stopped, or left without withdrawing, as far as Redis can tell."""
    wait = _Wait(lock, time.monotonic() + 60)
    keys, args = wait.attempt(time.monotonic())
    assert wait.took(get_script("django_redislua.lock_acquire")(keys=keys, args=args)) is not None
    return wait


@pytest.mark.parametrize("departed", [1, 2])
def test_a_departed_waiter_delays_the_next_by_at_most_the_claim_window(
    where: str, departed: int
) -> None:
    """Two departed waiters queued ahead cost one claim window in all, not two: nobody but the
    heir is told of a hand-off, so the live waiter looks again every claim window, finds the
    heir's claim, and takes the lock when it runs out."""
    holder = Lock("gone", timeout=20)
    assert holder.acquire()
    for _ in range(departed):
        park(Lock("gone", timeout=20))  # queued ahead, never confirms
    live = queue_behind(holder, Waiter(Lock("gone", timeout=20), hold=None), departed + 1)
    released_at = time.monotonic()
    holder.release()
    live.join(5)
    # Not the departed waiter's 20 s lease: the claim window, then the live one.
    assert live.acquired and WINDOW - 0.05 < live.at - released_at < WINDOW + 0.1
    assert live.lock.owned()
    live.lock.release()


async def test_async_a_departed_waiter_delays_the_next_by_at_most_the_claim_window(
    where: str,
) -> None:
    holder = Lock("agone", timeout=20)
    assert await holder.aacquire()
    park(Lock("agone", timeout=20))
    live = Lock("agone", timeout=20)
    task = asyncio.ensure_future(live.aacquire())
    await auntil(lambda: queued(holder) >= 2)
    released_at = time.monotonic()
    await holder.arelease()
    assert await asyncio.wait_for(task, 5)
    assert time.monotonic() - released_at < WINDOW + 0.1
    await live.arelease()


def test_stale_registrations_are_dropped_before_a_hand_off(where: str) -> None:
    holder = Lock("stale", timeout=30)
    assert holder.acquire()
    departed = _Wait(Lock("stale", timeout=30), time.monotonic())  # its registration lasts ~1 s
    keys, args = departed.attempt(time.monotonic())
    args[5] = 1  # stay queued 1 ms
    get_script("django_redislua.lock_acquire")(keys=keys, args=args)
    time.sleep(0.01)
    holder.release()
    assert not holder.locked()  # no claim went to the stale registration
    assert queued(holder) == 0


def test_a_stale_head_is_dropped_with_the_stale_registrations_behind_the_live_heir(
        where: str) -> None:
    holder = Lock("stale-head", timeout=30)
    assert holder.acquire()

    def departed() -> None:  # a waiter that died without withdrawing: registered for 1 ms
        wait = _Wait(Lock("stale-head", timeout=30), time.monotonic())
        keys, args = wait.attempt(time.monotonic())
        args[5] = 1
        get_script("django_redislua.lock_acquire")(keys=keys, args=args)

    departed()
    heir = Lock("stale-head", timeout=30)
    waiter = queue_behind(holder, Waiter(heir, hold=None, blocking_timeout=10), 2)
    departed()  # behind the live waiter
    time.sleep(0.01)
    holder.release()
    waiter.join(5)
    assert waiter.acquired and heir.owned()
    assert queued(holder) == 0  # both stale registrations gone, the one behind the heir too
    assert get_client().zcard(holder.keys.sub("stale")) == 0
    heir.release()


def test_tombstones_that_ran_out_are_dropped_when_another_is_added(where: str) -> None:
    """A lock that is never idle keeps its stale set alive: a withdrawal's tombstone drops the
    ones whose minute has passed, so the set holds only the last minute's."""
    holder = Lock("tombstones", timeout=30)
    assert holder.acquire()
    client = get_client()
    stale = holder.keys.sub("stale")
    client.zadd(stale, {f"x:{n:016x}": 1 for n in range(150)})  # long run out
    wait = _Wait(Lock("tombstones", timeout=30), time.monotonic() + 1.0)
    keys, args = wait.withdraw("give")
    get_script("django_redislua.lock_withdraw")(keys=keys, args=args)
    left = {m.decode() if isinstance(m, bytes) else m for m in client.zrange(stale, 0, -1)}
    # At most PRUNE_LIMIT (100) a call: bounded work; the next withdrawal drops the rest.
    assert len(left) == 150 - 100 + 1 and f"x:{wait.id}" in left
    wait = _Wait(Lock("tombstones", timeout=30), time.monotonic() + 1.0)
    keys, args = wait.withdraw("give")
    get_script("django_redislua.lock_withdraw")(keys=keys, args=args)
    assert client.zcard(stale) == 2
    holder.release()


def test_a_release_does_the_least_server_work(r: Any, recorder: Any) -> None:
    """What a release runs on the server, pinned: uncontended, four commands; handing off, nine
    (the heir's registration popped and checked, the fencing counter written but not read: the
    freed hold's token is the last one handed out, and the freed hold's fields overwritten)."""
    call_command("redislua_preload", stdout=StringIO())
    holder = Lock("least-work", timeout=30)
    assert holder.acquire()
    with recorder:
        holder.release()
    assert recorder.script_commands == ["HMGET", "ZPOPMIN", "DEL", "PUBLISH"]
    assert holder.acquire()
    heir = Lock("least-work", timeout=30)
    waiter = queue_behind(holder, Waiter(heir, hold=None, blocking_timeout=10), 1)
    token = holder.token
    with CommandRecorder(r) as handing_off:
        holder.release()
        waiter.join(5)
    assert handing_off.commands == ["EVALSHA", "EVALSHA"]  # the release, the heir's confirm
    release = ["HMGET", "ZPOPMIN", "TIME", "ZSCORE", "ZREM", "SET", "HSET", "PEXPIRE", "PUBLISH"]
    assert handing_off.script_commands == [*release, "HMGET", "HDEL", "PEXPIRE"]  # + confirm
    assert waiter.acquired and heir.token is not None and token is not None and heir.token > token
    assert int(r.get(heir.keys.sub("fence"))) == heir.token
    heir.release()



def test_what_every_lock_call_sends_follows_the_settings(r: Any) -> None:
    """The claim window and the inbox prefix go with every acquire and release and are made
    once per settings change: a changed KEY_PREFIX or LOCK_CLAIM_WINDOW holds from the next
    call (the heir's inbox channel, the claim's PEXPIRE), and so does changing it back."""
    call_command("redislua_preload", stdout=StringIO())
    for prefix, window in (("moved", 0.25), ("rl", 0.4), ("moved", 0.25)):
        with override_settings(REDISLUA={**settings.REDISLUA, "KEY_PREFIX": prefix,
                                         "LOCK_CLAIM_WINDOW": window}):
            holder, heir = Lock("follows", timeout=30), Lock("follows", timeout=30)
            assert holder.acquire()
            waiter = queue_behind(holder, Waiter(heir, hold=None, blocking_timeout=10), 1)
            with CommandRecorder(r) as handing_off:
                holder.release()
                waiter.join(5)
            assert waiter.acquired
            sent = [e["command"] for e in handing_off.entries if e.get("client_type") == "lua"]
            assert any(c.startswith(f"PUBLISH {prefix}:inbox:") for c in sent), sent
            claim = f"PEXPIRE {heir.keys.base} {round(window * 1000)}"
            assert claim in sent, sent
            heir.release()


WAITER_PROCESS = """
import os, sys, time
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
import django
django.setup()
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings
from redis.client import PubSub
from django_redislua.connection import get_client
from django_redislua.locks import Lock, LockNotOwned, LockUnavailable, Semaphore
with override_settings(REDISLUA={**settings.REDISLUA, "LOCK_CLAIM_WINDOW": float(sys.argv[1])}):
    lock = Lock("proc", timeout=20)
    assert lock.acquire()
    get_client().rpush("proc-order", os.getpid())
    lock.release()
"""


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_a_killed_or_stopped_waiter_process_costs_at_most_the_window(r: Any, fault: str) -> None:
    with override_settings(REDISLUA={**settings.REDISLUA, "LOCK_CLAIM_WINDOW": WINDOW}):
        holder = Lock("proc", timeout=20)
        assert holder.acquire()
        process = subprocess.Popen([sys.executable, "-c", WAITER_PROCESS, str(WINDOW)], cwd=ROOT)
        try:
            until(lambda: queued(holder) == 1, 30, "the waiter process to queue")
            os.kill(process.pid, getattr(signal, fault))
            live = queue_behind(holder, Waiter(Lock("proc", timeout=20), hold=0.05), 2)
            released_at = time.monotonic()
            holder.release()
            live.join(5)
            assert live.acquired and live.at - released_at < WINDOW + 0.1
            if fault == "SIGSTOP":
                # Resumed, it finds its claim gone, queues again and gets the lock in turn.
                os.kill(process.pid, signal.SIGCONT)
                assert process.wait(10) == 0
                assert [int(p) for p in r.lrange("proc-order", 0, -1)] == [process.pid]
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()


# -- grants belong to one wait ----------------------------------------------------------------

def test_a_grant_never_admits_another_acquire_of_the_same_lock_object(where: str) -> None:
    holder, shared = Lock("one", timeout=30), Lock("one", timeout=30)
    assert holder.acquire()
    first = queue_behind(holder, Waiter(shared, hold=None), 1)
    holder.release()
    first.join(5)
    assert first.acquired
    # Another thread on the same non-reentrant object: it waits like anyone else.
    assert not shared.acquire(blocking_timeout=0.2)
    assert not shared.acquire(blocking=False)
    shared.release()
    assert not shared.locked()


async def test_async_a_grant_never_admits_another_aacquire_of_the_same_lock_object(
    where: str,
) -> None:
    holder, shared = Lock("aone", timeout=30), Lock("aone", timeout=30)
    assert await holder.aacquire()
    first = asyncio.ensure_future(shared.aacquire())
    await auntil(lambda: queued(holder) == 1)
    await holder.arelease()
    assert await asyncio.wait_for(first, 5)
    assert not await shared.aacquire(blocking_timeout=0.2)
    await shared.arelease()
    assert not await shared.alocked()


# -- every way out of a wait withdraws ----------------------------------------------------------

def test_a_waiter_that_times_out_leaves_the_queue_and_gets_nothing(where: str) -> None:
    holder, waiter = Lock("t", timeout=30), Lock("t", timeout=30)
    assert holder.acquire()
    started = time.monotonic()
    assert not waiter.acquire(blocking_timeout=0.2)
    assert time.monotonic() - started < 0.2 + 0.5  # at most the socket timeout late
    assert queued(waiter) == 0
    holder.release()
    assert not holder.locked()  # no hand-off to a waiter that gave up


class Interrupted(Exception):
    pass


@pytest.mark.parametrize("raised", [Interrupted, KeyboardInterrupt])
def test_a_sync_waiter_interrupted_by_an_exception_withdraws(where: str, raised: type) -> None:
    holder, waiter = Lock("ki", timeout=30), Lock("ki", timeout=30)
    assert holder.acquire()

    def interrupt(signum: int, frame: object) -> None:
        raise raised("interrupted")

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    try:
        with pytest.raises(raised):
            waiter.acquire(blocking_timeout=5)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert queued(waiter) == 0
    holder.release()
    assert not holder.locked()


def test_a_hand_off_at_the_deadline_is_taken_by_the_withdrawal(where: str) -> None:
    holder, heir = Lock("d", timeout=30), Lock("d", timeout=30)
    assert holder.acquire()
    wait = park(heir)
    holder.release()  # the claim goes to the parked wait, whose deadline is now
    assert run(heir._withdrawing(wait, "take"))
    assert heir.owned() and queued(heir) == 0
    assert get_client().pttl(heir.keys.base) > 25_000
    heir.release()


async def test_async_cancelled_waiters_leave_no_registration(patient: str) -> None:
    # Patient: three waiters connecting at once on an event loop paused past the default 0.5 s
    # failed one of them (a clean-clone CI run on the cluster: it never queued).
    holder = Lock("ac", timeout=30)
    assert await holder.aacquire()
    tasks = [asyncio.ensure_future(Lock("ac", timeout=30).aacquire()) for _ in range(3)]

    def all_queued() -> bool:
        ended = [task for task in tasks if task.done()]
        assert not ended, [task.exception() for task in ended]  # a waiter failed: why
        return queued(holder) == 3

    await auntil(all_queued)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await auntil(lambda: queued(holder) == 0)  # the background withdrawals
    await holder.arelease()
    assert not await holder.alocked()


async def test_async_a_cancelled_heir_passes_its_claim_on_at_once(where: str) -> None:
    holder, cancelled, live = (Lock("pass", timeout=30) for _ in range(3))
    assert await holder.aacquire()
    wait = park(cancelled)
    task = asyncio.ensure_future(live.aacquire())
    await auntil(lambda: queued(holder) == 2)
    released_at = time.monotonic()
    await holder.arelease()  # the claim goes to the parked wait...
    await arun(cancelled._giving_back(wait))  # ...whose acquire is cancelled: it gives the claim on
    assert await asyncio.wait_for(task, 5)
    assert time.monotonic() - released_at < WINDOW / 2  # not after the window
    await live.arelease()


async def test_async_a_reentry_cancelled_in_flight_is_undone(where: str) -> None:
    lock = Lock("re", timeout=30, reentrant=True)
    assert await lock.aacquire()
    client = get_client()
    node = client.get_redis_connection(client.get_node_from_key(lock.keys.base)) \
        if where == "cluster" else client
    node.client_pause(300)  # the re-entry's script call waits on the server...
    task = asyncio.ensure_future(lock.aacquire())
    await asyncio.sleep(0.1)
    task.cancel()  # ...and its caller is cancelled meanwhile; the call still runs after
    await asyncio.gather(task, return_exceptions=True)
    await auntil(lambda: client.hget(lock.keys.base, "count") == b"1", 3)
    await asyncio.sleep(0.1)
    assert client.hget(lock.keys.base, "count") == b"1"
    await lock.arelease()  # the local depth and Redis agree: one release frees it
    assert not await lock.alocked()


# -- a slow first try is part of the wait ----------------------------------------------------

PAUSE_MS = 1000  # the first try waits this long on a paused server...
LIMIT = 0.5  # ...out of a wait of this long: the deadline has passed when it returns
# What a wait that counts its limit from the call does, on any machine: two tries (the first,
# which returns after the deadline; the one every wait begins with once subscribed), then no
# other (a lock's withdrawal is another script). When the limit was counted from after the
# first try, a third try ended a sleep until that later deadline, and the wait took PAUSE_MS +
# LIMIT. Counted from what the server received, not timed: a bound on the wait's duration
# fails on a loaded machine (a clean-clone CI run's lock chaos test saw a wait end 0.85 s past
# its deadline: a 0.29 s first try behind a pause, then a socket timeout). The pause outlasts
# the limit by 0.5 s, which is what the test's own two statements (pausing, then calling) may
# take before the first try is sent without the try ending before the deadline.


def pause_owner(key: str) -> None:
    owner_of(key).client_pause(PAUSE_MS)


def tries(recorder: CommandRecorder, script: str) -> int:
    """How many calls of ``script`` the server received while ``recorder`` ran."""
    head = " ".join(get_script(script).head())
    return sum(1 for entry in recorder.entries if str(entry["command"]).startswith(head))


def test_a_slow_first_try_counts_against_blocking_timeout(patient: str) -> None:
    holder = Lock("slowfirst", timeout=30)
    assert holder.acquire()
    waiter = Lock("slowfirst", timeout=30)
    assert waiter.locked()  # connected: the pause delays the try, not a connect
    with CommandRecorder(get_client()) as recorder:
        pause_owner(holder.keys.base)
        started = time.monotonic()
        assert not waiter.acquire(blocking_timeout=LIMIT)
        took = time.monotonic() - started
    assert took >= LIMIT, took  # the first try did return after the deadline
    assert tries(recorder, "django_redislua.lock_acquire") == 2
    assert queued(holder) == 0
    holder.release()


async def test_async_a_slow_first_try_counts_against_blocking_timeout(patient: str) -> None:
    holder = Lock("aslowfirst", timeout=30)
    assert await holder.aacquire()
    waiter = Lock("aslowfirst", timeout=30)
    assert await waiter.alocked()  # connected: the pause delays the try, not a connect
    with CommandRecorder(get_client()) as recorder:
        pause_owner(holder.keys.base)
        started = time.monotonic()
        assert not await waiter.aacquire(blocking_timeout=LIMIT)
        took = time.monotonic() - started
    assert took >= LIMIT, took
    assert tries(recorder, "django_redislua.lock_acquire") == 2
    await holder.arelease()


@pytest.mark.parametrize("asyncio_", [False, True], ids=["sync", "async"])
async def test_a_semaphores_slow_first_try_counts_against_blocking_timeout(
        patient: str, asyncio_: bool) -> None:
    holder, waiter = (Semaphore("slowsem", limit=1, timeout=30) for _ in range(2))
    assert await asyncio.to_thread(waiter.acquire)  # connected, on both paths: the pause
    await asyncio.to_thread(waiter.release)  # delays the try, not a connect
    assert await waiter.aacquire()
    await waiter.arelease()
    assert await holder.aacquire()
    with CommandRecorder(get_client()) as recorder:
        pause_owner(holder.keys.base)
        started = time.monotonic()
        if asyncio_:
            assert not await waiter.aacquire(blocking_timeout=LIMIT)
        else:
            assert not await asyncio.to_thread(waiter.acquire, blocking_timeout=LIMIT)
        took = time.monotonic() - started
    assert took >= LIMIT, took
    assert tries(recorder, "django_redislua.semaphore_acquire") == 2
    await holder.arelease()


# -- renewal ----------------------------------------------------------------------------------

def test_auto_renew_rides_out_a_client_pause_across_the_first_renewal(where: str) -> None:
    lock = Lock("pause", timeout=3, auto_renew=True)
    lost: list[Lock] = []
    lock.on_lost = lost.append
    client = get_client()
    node = client.get_redis_connection(client.get_node_from_key(lock.keys.base)) \
        if where == "cluster" else client
    assert lock.acquire()
    time.sleep(0.7)
    node.client_pause(1500)  # the first renewal (at 1 s) fails; the next ones are in time
    time.sleep(2.8)
    assert not lock.lost and not lost
    assert lock.owned()
    assert not Lock("pause", timeout=3).acquire(blocking=False)
    lock.release()


async def test_async_auto_renew_rides_out_a_client_pause(where: str) -> None:
    lock = Lock("apause", timeout=3, auto_renew=True)
    client = get_client()
    node = client.get_redis_connection(client.get_node_from_key(lock.keys.base)) \
        if where == "cluster" else client
    assert await lock.aacquire()
    await asyncio.sleep(0.7)
    node.client_pause(1500)
    await asyncio.sleep(2.8)
    assert not lock.lost and await lock.aowned()
    await lock.arelease()


def test_lost_flips_when_the_lease_runs_out_on_this_clock(where: str) -> None:
    assert not Lock("short", timeout=5).locked()  # connected: the acquire below is one call
    lock = Lock("short", timeout=1)  # a lease a loaded machine's acquire cannot outlast
    assert lock.acquire()
    assert not lock.lost
    time.sleep(1.02)
    assert lock.lost  # no renewal, no round trip needed to know
    assert Lock("short", timeout=5).acquire(blocking=False)


HOLDER_PROCESS = """
import os, sys, time
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
import django
django.setup()
from django_redislua.connection import get_client
from django_redislua.locks import Lock, LockNotOwned, LockUnavailable, Semaphore
client = get_client()
lock = Lock("stopped", timeout=1, auto_renew=True,
            on_lost=lambda lock: client.set("on-lost-at", repr(time.monotonic())))
assert lock.acquire()
client.set("holder-ready", 1)
deadline = time.monotonic() + 30
while not lock.lost and time.monotonic() < deadline:
    time.sleep(0.005)
client.set("lost-at", repr(time.monotonic()))
time.sleep(0.5)
"""


@pytest.mark.slow
def test_a_stopped_holder_reads_lost_as_soon_as_it_resumes(r: Any) -> None:
    process = subprocess.Popen([sys.executable, "-c", HOLDER_PROCESS], cwd=ROOT)
    try:
        until(lambda: bool(r.exists("holder-ready")), 30, "the holder")
        os.kill(process.pid, signal.SIGSTOP)
        time.sleep(1.5)  # its 1 s lease runs out while it cannot renew
        assert Lock("stopped", timeout=5).acquire(blocking=False)  # someone else has it now
        resumed_at = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process here
        os.kill(process.pid, signal.SIGCONT)
        assert process.wait(10) == 0
        assert float(r.get("lost-at")) - resumed_at < 0.1
        assert float(r.get("on-lost-at")) - resumed_at < 0.6  # the renewer says so too
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def test_a_release_that_fails_stops_the_renewer(r: Any) -> None:
    # Single node: redis-py's cluster client retries a timed-out command until a pause short
    # enough to keep the lease is over, so the release there does not fail.
    from django_redislua.locks import LockUnavailable

    with override_settings(REDISLUA={**settings.REDISLUA, "SOCKET_TIMEOUT": 0.5}):
        lock = Lock("orphan", timeout=1, auto_renew=True)
        assert lock.acquire()
        r.client_pause(800)
        with pytest.raises(LockUnavailable):
            lock.release()  # times out (SOCKET_TIMEOUT 0.5 s): its outcome is unknown
        assert lock._renewer is None  # nothing keeps renewing a lock its owner let go
        until(lambda: not r.exists(lock.keys.base), 2.5, "the lease to end")


def test_a_newcomer_does_not_overtake_the_queue_when_the_lock_comes_free(where: str) -> None:
    holder = Lock("newcomer", timeout=0.2)
    assert holder.acquire()  # never released: its lease runs out
    queued_first = Lock("newcomer", timeout=30)
    wait = park(queued_first)
    time.sleep(0.25)
    client = get_client()
    assert not client.exists(holder.keys.base)  # free, with a waiter queued
    assert not Lock("newcomer", timeout=30).acquire(blocking=False)  # offered to the queue
    assert client.hget(holder.keys.base, "wait") == wait.id.encode()
    assert run(queued_first._withdrawing(wait, "take"))  # the queued waiter has it
    queued_first.release()


async def test_async_renewal_reports_a_lease_taken_by_another(where: str) -> None:
    from django_redislua.locks.inspect import force_release

    lost: list[Lock] = []
    lock = Lock("ataken", timeout=0.6, auto_renew=True, on_lost=lost.append)
    assert await lock.aacquire()
    assert force_release("ataken")
    assert await Lock("ataken", timeout=30).aacquire(blocking=False)  # someone else has it
    await auntil(lambda: bool(lost), 2)  # the next renewal (at 0.2 s) is refused
    assert lost == [lock] and lock.lost
    with pytest.raises(LockNotOwned):
        await lock.arelease()
