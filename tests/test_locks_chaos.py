"""Chaos test of ``Lock``: worker processes lock at random while the test kills them, freezes
them, pauses Redis and restarts it (losing its data); every holder's log is then checked.

How it runs (docs/reliability.md explains it for readers):

* A dedicated throwaway ``RedisServer`` (not the suite's shared one: it is restarted).
* ``WORKERS`` spawned processes (``python -m tests.test_locks_chaos worker ...``, with
  ``DJANGO_SETTINGS_MODULE=tests.settings`` and ``REDIS_URL`` of that server, and a claim window
  of ``CLAIM_WINDOW``) loop over random operations on ``NAMES``: blocking, non-blocking or
  ``blocking_timeout`` acquires, reentrant re-entries, auto-renewed leases, holds, releases.
* The test injects faults meanwhile: SIGKILL of holders and of waiters (each replaced by a new
  worker), SIGSTOP/SIGCONT of holders (stopped past their lease) and of waiters, ``CLIENT PAUSE``
  and a Redis crash and restart on the same port without persistence.
* Each worker appends one line per event to its own file (one ``write`` per line, so the lines
  of a SIGKILLed process survive), timed with ``time.monotonic()``: CLOCK_MONOTONIC, one clock
  for every process on a Linux machine.

Then the checker asserts, from the logs and the test's own record of the faults:

1. fencing tokens are unique per name and follow the real-time order of acquisitions;
2. no two holders' protected intervals overlap, and a release that succeeded was not
   interleaved with another acquisition; and no holder loses a lease it still had;
3. after a release with a live waiter queued, the next holder's taking call is sent within the
   claim window + 100 ms, even with dead registrations queued ahead;
4. no wait outlasts its ``blocking_timeout`` by more than the socket timeout + a scheduling
   margin, whether it returned or raised ``LockUnavailable``.

Figures are printed and written to ``FIGURES_PATH``. Run it with
``.venv/bin/python -m pytest tests/test_locks_chaos.py -q -s``. ``CHAOS_SEED=<n>`` replays a
fault schedule (the processes' timing is not replayed).
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

WORKERS = 8
NAMES = ("chaos:a", "chaos:b", "chaos:c")
CLAIM_WINDOW = 0.3  # REDISLUA["LOCK_CLAIM_WINDOW"] in the workers (default 1.0 s)
LEASES = (0.5, 2.0)  # each acquisition's lease, uniform in this range (seconds)
# The fault plan, shuffled; one fault every FAULT_GAP seconds.
PLAN = {"kill_holder": 3, "kill_waiter": 3, "stop_holder": 3, "stop_waiter": 3, "pause": 4,
        "restart": 2}
FAULT_GAP = (0.8, 1.5)
PAUSE_MS = (300, 1500)
CALM = 4.0  # seconds without faults at the end, so the last releases can be checked
WALL_LIMIT = 60.0  # the whole test, start to finish
# Check 3: the next holder's call must be sent within CLAIM_WINDOW + HANDOFF_MARGIN of the
# release (the 100 ms). The horizon over which a release's context is examined is
# widened per dead registration that may be queued ahead; the bound is not.
HANDOFF_MARGIN = 0.1
# Check 4: Python, the kernel and a 2-CPU machine running ~10 processes get this much slack on
# top of the socket timeout(s) a wait may spend after its deadline.
SCHED_MARGIN = 0.25
FIGURES_PATH = Path("/tmp/django_redislua_chaos_figures.json")
# Every loop of the workers is bounded in time too.
WORKER_MAX_SECONDS = 120.0


def now() -> float:
    return time.monotonic()


# -- the worker process ------------------------------------------------------------------------
#
# Log lines (times: time.monotonic(); <wid> names one acquire call, "<worker>.<n>"):
#   B pid t                                  started (Django set up)
#   S wid name mode limit lease renew reentrant t    an acquire call starts (mode: nonblock,
#                                            timeout, block; limit: blocking_timeout)
#   Q wid t                                  its first queued try came back: it is queued
#   E wid t outcome                          it ended without the lock ("0", or the exception)
#   A wid name token sent returned deadline depth    it took the lock: the taking call was
#                                            sent at `sent`, the lease ends at `deadline`
#   R wid token t entered deadline depth     a re-entry (or R wid token t <exception>)
#   D wid token t deadline                   the lease was renewed: its new end
#   L wid token t                            `lock.lost` first seen True
#   X wid token n t depth deadline           release call n is sent
#   Y wid token n t outcome deadline lost    ... and returned: re-entries left, or exception
#   I wid t / Z t / F t traceback            operation over / worker done / worker failed


class _Log:
    """Append-only event log: one ``os.write`` per line, nothing buffered in the process."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, *fields: object) -> None:
        text = " ".join(f"{f:.6f}" if isinstance(f, float) else str(f) for f in fields)
        os.write(self.fd, (text + "\n").encode())

    def close(self) -> None:
        os.close(self.fd)


def _worker(ident: str, logdir: str, seed: int) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.test.utils import override_settings

    override_settings(REDISLUA={**settings.REDISLUA, "LOCK_CLAIM_WINDOW": CLAIM_WINDOW}).enable()

    from django_redislua.locks import Lock, LockError, LockNotOwned, LockUnavailable
    from django_redislua.locks import lock as lock_module

    log = _Log(os.path.join(logdir, f"{ident}.log"))
    stop_flag = os.path.join(logdir, "stop")
    current = {"wid": ""}
    original_until = lock_module.until

    def until(channel: Any, attempt: Any, timeout: float | None, on_message: Any = None,
              *rest: Any) -> Any:
        """Log when the wait is first known to be queued: its first queued try came back
        without the lock (the acquire script queued it before replying)."""
        first = [True]

        def logged_attempt() -> Any:
            result: float | None = yield from attempt()
            if first[0] and result is not None:
                first[0] = False
                log.write("Q", current["wid"], now())
            return result

        return original_until(channel, logged_attempt, timeout, on_message, *rest)

    lock_module.until = until  # type: ignore[assignment]
    rng = random.Random(seed)
    started = now()
    log.write("B", os.getpid(), now())

    def stopping() -> bool:
        return os.path.exists(stop_flag) or now() - started > WORKER_MAX_SECONDS

    def operation(wid: str) -> None:
        name = rng.choice(NAMES)
        lease = round(rng.uniform(*LEASES), 3)
        renew = rng.random() < 0.3
        reentrant = rng.random() < 0.3
        mode = rng.choices(["nonblock", "timeout", "block"], [0.3, 0.55, 0.15])[0]
        limit = {"nonblock": 0.0, "timeout": round(rng.uniform(0.05, 2.5), 3), "block": -1.0}[mode]
        lock = Lock(name, timeout=lease, reentrant=reentrant, auto_renew=renew)
        current["wid"] = wid
        log.write("S", wid, name, mode, limit, lease, int(renew), int(reentrant), now())
        try:
            if mode == "nonblock":
                acquired = lock.acquire(blocking=False)
            elif mode == "timeout":
                acquired = lock.acquire(blocking=True, blocking_timeout=limit)
            else:
                acquired = lock.acquire(blocking=True)
        except LockError as exc:
            log.write("E", wid, now(), type(exc).__name__)
            return
        returned = now()
        if not acquired:
            log.write("E", wid, returned, "0")
            return
        log.write("A", wid, name, lock.token, lock._lease.deadline - lease, returned,
                  lock._lease.deadline, lock._depth)
        # Renewed holds outlast their lease; a plain hold outlasts it now and then.
        hold(wid, lock, rng.uniform(0.3, 2.0) if renew else rng.uniform(0.02, 0.6),
             rng.randint(1, 2) if reentrant else 0)
        release(wid, lock)

    def hold(wid: str, lock: Any, seconds: float, reentries: int) -> None:
        token, deadline, lost = lock.token, lock._lease.deadline, False
        end = now() + seconds
        enter_at = sorted(rng.uniform(now(), end) for _ in range(reentries))
        for _ in range(1000):  # 50 ms slices; bounded by `end` (at most 2 s) anyway
            t = now()
            if lock._lease.deadline != deadline:  # renewed, or re-entered
                deadline = lock._lease.deadline
                log.write("D", wid, token, t, deadline)
            if not lost and lock.lost:
                lost = True
                log.write("L", wid, token, t)
            if enter_at and t >= enter_at[0] and not lost:
                enter_at.pop(0)
                try:
                    entered = lock.acquire(blocking=False)
                except LockError as exc:
                    log.write("R", wid, token, now(), type(exc).__name__)
                    continue
                t = now()
                if entered and lock.token != token:  # the lease was gone: a new acquisition
                    token = lock.token
                    log.write("A", wid, lock.name, token, lock._lease.deadline - lock.timeout,
                              t, lock._lease.deadline, lock._depth)
                else:
                    log.write("R", wid, token, t, int(entered), lock._lease.deadline,
                              lock._depth)
                deadline = lock._lease.deadline
            if t >= end or stopping():
                return
            time.sleep(max(min(0.05, end - t), 0.0))

    def release(wid: str, lock: Any) -> None:
        for number in range(8):  # one call per re-entry, and retries of failed calls
            if lock._depth <= 0:
                return
            token, depth = lock.token, lock._depth
            log.write("X", wid, token, number, now(), depth, lock._lease.deadline)
            try:
                lock.release()
                outcome = str(lock._depth)
            except LockUnavailable:
                outcome = "LockUnavailable"
            except LockNotOwned as exc:
                outcome = type(exc).__name__
            log.write("Y", wid, token, number, now(), outcome, lock._lease.deadline,
                      int(lock.lost))
            if outcome == "LockUnavailable":
                time.sleep(0.2 + 0.1 * number)
        # A release that raised LockUnavailable stopped the renewer: the lease ends by itself.
        assert lock._renewer is None

    try:
        for number in range(100_000):
            if stopping():
                break
            operation(f"{ident}.{number}")
            log.write("I", current["wid"], now())
            time.sleep(rng.uniform(0.0, 0.25))
        log.write("Z", now())
    except BaseException:
        import traceback

        log.write("F", now(), traceback.format_exc().replace("\n", " | "))
        raise
    finally:
        log.close()


# -- the test process: workers and faults ------------------------------------------------------


@dataclass
class Worker:
    ident: str
    process: subprocess.Popen[bytes]
    log: Path
    offset: int = 0
    ready: bool = False
    state: str = "idle"  # idle, wait (a blocking wait), hold
    queued: bool = False
    lease: float = 0.0
    stopped: bool = False
    killed: tuple[float, float] | None = None  # (signal sent, process reaped)
    stops: list[tuple[float, float]] = field(default_factory=list)

    def read(self) -> None:
        """Follow the worker's own log: is it waiting, queued, holding?"""
        with open(self.log, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            kind, *rest = line.split(" ")
            if kind == "B":
                self.ready = True
            elif kind == "S":
                self.state = "wait" if rest[2] != "nonblock" else "try"
                self.queued, self.lease = False, float(rest[4])
            elif kind == "Q":
                self.queued = True
            elif kind == "A":
                self.state = "hold"
            elif kind in ("E", "I"):
                self.state = "idle"


class Chaos:
    """The workers, the server, and the record of every fault injected."""

    def __init__(self, logdir: Path, seed: int) -> None:
        from django_redislua.testing import RedisServer

        self.logdir = logdir
        self.rng = random.Random(seed)
        self.seed = seed
        self.server = RedisServer().start()
        self.port = self.server.port
        self.workers: list[Worker] = []
        self.spawned = 0
        self.faults: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.pauses: list[tuple[float, float]] = []
        self.restarts: list[tuple[float, float]] = []
        self.conts: list[tuple[float, Worker]] = []  # (when, worker) SIGCONTs due
        self.observed_until = math.inf  # when the workers were asked to finish
        self.timeline: list[tuple[float, str]] = []  # (when it began, what): for the figures
        self.t0 = now()

    def spawn(self) -> Worker:
        ident = f"w{self.spawned}"
        self.spawned += 1
        env = {**os.environ, "REDIS_URL": self.server.url,
               "DJANGO_SETTINGS_MODULE": "tests.settings"}
        root = Path(__file__).resolve().parent.parent
        with open(self.logdir / f"{ident}.out", "wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.test_locks_chaos", "worker", ident,
                 str(self.logdir), str(self.rng.randrange(2**32))],
                cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
            )
        worker = Worker(ident, process, self.logdir / f"{ident}.log")
        worker.log.touch()
        self.workers.append(worker)
        return worker

    def live(self) -> list[Worker]:
        return [w for w in self.workers if w.killed is None]

    def poll(self) -> None:
        for worker in self.live():
            worker.read()
            if worker.process.poll() is not None and not worker.stopped:
                raise AssertionError(f"worker {worker.ident} exited by itself "
                                     f"({worker.process.returncode}): "
                                     f"{(self.logdir / (worker.ident + '.out')).read_text()}")
        due = [(t, w) for t, w in self.conts if t <= now()]
        for entry in due:
            self.conts.remove(entry)
            self.cont(entry[1])

    def cont(self, worker: Worker) -> None:
        os.kill(worker.process.pid, signal.SIGCONT)
        worker.stops[-1] = (worker.stops[-1][0], now())
        worker.stopped = False

    def targets(self, state: str) -> list[Worker]:
        found = [w for w in self.live() if w.ready and not w.stopped and w.state == state]
        if state == "wait":
            found = [w for w in found if w.queued]
        return found

    def inject(self, kind: str) -> bool:
        """One fault; False when no worker is in the state it needs (yet)."""
        began = now()
        if kind == "pause":
            if self.pauses and began < self.pauses[-1][1] + 0.5:
                return False  # one stall at a time: a pause queued behind another extends it
            ms = self.rng.randint(*PAUSE_MS)
            client = self._control()
            try:
                sent = now()
                client.execute_command("CLIENT", "PAUSE", ms, "ALL")
                self.pauses.append((sent, now() + ms / 1000))
                kind = f"pause {ms}ms"
            finally:
                client.close()
        elif kind == "restart":
            from django_redislua.testing import RedisServer

            assert self.server.process is not None
            self.server.process.kill()  # a crash: no shutdown, no persistence
            self.server.process.wait()
            self.server.stop()
            self.server = RedisServer(port=self.port).start()
            self.restarts.append((began, now()))
        else:
            action, role = kind.split("_")
            candidates = self.targets("hold" if role == "holder" else "wait")
            if not candidates:
                return False
            worker = self.rng.choice(candidates)
            if action == "kill":
                sent = now()
                kind += f" {worker.ident}"
                worker.process.kill()
                worker.process.wait()
                worker.killed = (sent, now())
                worker.read()
                self.spawn()
            else:
                pause = (worker.lease + self.rng.uniform(0.2, 0.8) if role == "holder"
                         else self.rng.uniform(0.5, 2.0))
                worker.stops.append((now(), math.inf))
                os.kill(worker.process.pid, signal.SIGSTOP)
                worker.stopped = True
                self.conts.append((now() + min(pause, 2.8), worker))
                kind += f" {worker.ident} {min(pause, 2.8):.2f}s"
        self.faults[kind.split()[0]] += 1
        self.timeline.append((began - self.t0, kind))
        return True

    def _control(self) -> Any:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        return self.server.client(socket_timeout=2, retry=Retry(NoBackoff(), 0))

    def run(self, chaos_seconds: float) -> None:
        plan = [kind for kind, count in PLAN.items() for _ in range(count)]
        self.rng.shuffle(plan)
        chaos_end = now() + chaos_seconds
        next_fault = now() + self.rng.uniform(*FAULT_GAP)
        tries = 0
        while now() < chaos_end + CALM:
            self.poll()
            if plan and now() >= next_fault and now() < chaos_end:
                if self.inject(plan[0]) or tries >= 30:
                    if tries >= 30:
                        self.skipped[plan[0]] += 1
                    plan.pop(0)
                    tries = 0
                    next_fault = now() + self.rng.uniform(*FAULT_GAP)
                else:
                    tries += 1  # retried every 50 ms, 1.5 s at most
            time.sleep(0.05)
        for kind in plan:
            self.skipped[kind] += 1

    def drain(self, limit: float) -> float:
        """Resume every stopped worker, ask all to finish, kill those still running after
        ``limit`` seconds. Returns when the stop was asked (the end of observation)."""
        for _, worker in list(self.conts):
            self.cont(worker)
        self.conts.clear()
        asked = now()
        (self.logdir / "stop").touch()
        deadline = asked + limit
        for worker in self.live():
            try:
                worker.process.wait(max(deadline - now(), 0.01))
            except subprocess.TimeoutExpired:
                sent = now()
                worker.process.kill()
                worker.process.wait()
                worker.killed = (sent, now())
        return asked

    def close(self) -> None:
        for _, worker in self.conts:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.process.pid, signal.SIGCONT)
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.kill()
            worker.process.wait()
        self.server.stop()


# -- the checker --------------------------------------------------------------------------------


@dataclass
class Wait:
    wid: str
    worker: Worker
    name: str
    mode: str
    limit: float  # blocking_timeout; 0 non-blocking; inf: wait as long as it takes
    start: float
    queued: float | None = None
    end: float | None = None
    outcome: str | None = None  # "1" acquired, "0" timed out, else the exception's name

    @property
    def deadline(self) -> float:
        return self.start + self.limit

    def registered_until(self) -> float:
        """Until when a registration of this wait (if it left none behind on purpose) may
        stay queued: the acquire script keeps it for min(time left, 60 s) + 1 s after each
        try, and the last try came before the end (or the kill) of the wait."""
        last = self.end if self.end is not None else (
            self.worker.killed[1] if self.worker.killed else math.inf)
        return min(self.deadline, last + 60.0) + 1.0 + 0.25


@dataclass
class Holding:
    name: str
    token: int
    wid: str
    worker: Worker
    sent: float  # the call that took the lock was sent then (the lease counts from there)
    acquired: float  # acquire() returned
    deadline: float  # the lease's end, as last renewed or re-entered
    lost: float = math.inf  # first seen `lock.lost`
    ends: list[float] = field(default_factory=list)  # release calls that may have freed it
    released_ok: tuple[float, float] | None = None  # (sent, returned) of a release that freed it
    failed_release: bool = False
    # Releases refused although they returned before the lease's end: (returned, what).
    spurious: list[tuple[float, str]] = field(default_factory=list)

    def end(self, restarts: list[tuple[float, float]]) -> float:
        """The end of protection: the first release that may have freed it, the lease's end,
        the moment it was known lost, or a Redis crash (its data is gone)."""
        cut = min((began for began, _ in restarts if began >= self.sent), default=math.inf)
        return min([self.deadline, self.lost, cut, *self.ends])


@dataclass
class Release:
    name: str
    token: int
    worker: Worker
    sent: float
    returned: float


def _stopped_during(worker: Worker, start: float, end: float) -> bool:
    return any(s < end and c > start for s, c in worker.stops)


def _overlaps(intervals: list[tuple[float, float]], start: float, end: float) -> bool:
    return any(a < end and b > start for a, b in intervals)


def parse(chaos: Chaos) -> tuple[list[Wait], dict[tuple[str, int], Holding], list[Release],
                                 list[str], Counter[str]]:
    waits: dict[str, Wait] = {}
    holdings: dict[tuple[str, int], Holding] = {}
    releases: list[Release] = []
    problems: list[str] = []
    stats: Counter[str] = Counter()
    for worker in chaos.workers:
        text = worker.log.read_bytes().decode(errors="replace")
        pending: dict[tuple[str, str], tuple[float, int]] = {}  # release calls sent
        for line in text.splitlines():
            kind, *f = line.split(" ")
            try:
                if kind == "S":
                    limit = {"nonblock": 0.0, "block": math.inf}.get(f[2], float(f[3]))
                    waits[f[0]] = Wait(f[0], worker, f[1], f[2], limit, float(f[7]))
                elif kind == "Q":
                    waits[f[0]].queued = float(f[1])
                elif kind == "E":
                    waits[f[0]].end, waits[f[0]].outcome = float(f[1]), f[2]
                elif kind == "A":
                    wid, name, token = f[0], f[1], int(f[2])
                    if wid in waits and waits[wid].end is None:
                        waits[wid].end, waits[wid].outcome = float(f[4]), "1"
                    if (name, token) in holdings:
                        problems.append(f"token {token} of {name} handed out twice "
                                        f"({holdings[name, token].wid} and {wid})")
                        continue
                    holdings[name, token] = Holding(name, token, wid, worker, float(f[3]),
                                                    float(f[4]), float(f[5]))
                elif kind in ("D", "R", "L", "X", "Y"):
                    held = holdings.get((waits[f[0]].name, int(f[1])))
                    if held is None:
                        continue
                    # Every deadline logged is the lease's end after a call that succeeded
                    # (acquire, re-entry, renewal): each is a sound lower bound of the
                    # server's expiry, the latest the best.
                    if kind == "D":
                        held.deadline = max(held.deadline, float(f[3]))
                    elif kind == "R":
                        stats["reentry " + ("ok" if f[3] == "1" else
                                            "refused" if f[3] == "0" else f[3])] += 1
                        if f[3] == "1":
                            held.deadline = max(held.deadline, float(f[4]))
                    elif kind == "L":
                        held.lost = min(held.lost, float(f[2]))
                        stats["lost seen while held"] += 1
                    elif kind == "X":
                        pending[f[0], f[2]] = (float(f[3]), int(f[4]))
                        # A release call may have freed it, until its reply says otherwise.
                        held.ends.append(float(f[3]))
                        held.deadline = max(held.deadline, float(f[5]))
                    else:
                        sent, _ = pending.pop((f[0], f[2]))
                        returned, outcome = float(f[3]), f[4]
                        stats["release " + ("ok" if outcome.isdigit() else outcome)] += 1
                        if outcome.isdigit() and int(outcome) > 0:
                            held.ends.remove(sent)  # one re-entry let go: still held
                        elif outcome == "0":
                            held.released_ok = (sent, returned)
                            releases.append(Release(held.name, held.token, worker, sent,
                                                    returned))
                        else:
                            held.failed_release = True
                            if outcome != "LockUnavailable" and returned < held.deadline:
                                held.spurious.append((returned,
                                    f"{outcome} on a release that returned "
                                    f"{held.deadline - returned:.3f}s before its lease's end"))
                elif kind == "F":
                    problems.append(f"worker {worker.ident} failed: {' '.join(f[1:])}")
            except (IndexError, ValueError, KeyError):
                continue  # a line cut by SIGKILL
    return list(waits.values()), holdings, releases, problems, stats


def check(chaos: Chaos, socket_timeout: float) -> dict[str, Any]:
    """Check the logs of ``chaos``'s workers; the figures, with any violations found."""
    waits, holdings, releases, problems, stats = parse(chaos)
    violations: dict[str, list[str]] = defaultdict(list)
    violations["0 worker errors"] += problems
    faults = chaos.pauses + chaos.restarts
    by_name: dict[str, list[Holding]] = defaultdict(list)
    for held in holdings.values():
        by_name[held.name].append(held)

    # 1. Tokens: real-time order (X returned before Y was sent => X's token is smaller), and the
    # acquisition order of holders whose protection was not empty.
    for name, group in by_name.items():
        by_return = sorted(group, key=lambda h: h.acquired)
        returns = [h.acquired for h in by_return]
        best: list[Holding] = []  # prefix maximum of tokens, in return order
        for held in by_return:
            best.append(held if not best or held.token > best[-1].token else best[-1])
        for held in group:
            before = bisect.bisect_left(returns, held.sent)
            if before and best[before - 1].token >= held.token:
                other = best[before - 1]
                violations["1 token order"].append(
                    f"{name}: {other.wid} got token {other.token} and returned "
                    f"{held.sent - other.acquired:.3f}s before {held.wid} sent the call "
                    f"that got the smaller token {held.token}")
        protected = [h for h in by_return if h.acquired < h.end(chaos.restarts)]
        for a, b in itertools.pairwise(protected):
            if b.token <= a.token:
                violations["1 token order"].append(
                    f"{name}: {a.wid} (token {a.token}) acquired before {b.wid} "
                    f"(token {b.token})")

    # 2. Mutual exclusion of protected intervals (2a); a successful release was not interleaved
    # with another acquisition (2b); no holder loses a lease it still had (2c).
    for name, group in by_name.items():
        spans = sorted(((h.acquired, h.end(chaos.restarts), h) for h in group),
                       key=lambda span: span[0])
        reach: tuple[float, Holding] | None = None  # the latest end so far, and whose
        for start, end, held in spans:
            if start >= end:
                continue  # nothing protected (acquire returned after the lease could end)
            if reach is not None and start < reach[0]:
                violations["2 overlap"].append(
                    f"{name}: {held.wid} (token {held.token}) acquired {reach[0] - start:.3f}s "
                    f"before the protection of {reach[1].wid} (token {reach[1].token}) ended")
            if reach is None or end > reach[0]:
                reach = (end, held)
        for held in group:
            for returned, what in held.spurious:
                if not _overlaps(chaos.restarts, held.sent, returned):
                    violations["2 lease kept"].append(f"{held.wid}: {what}")
            if held.released_ok is None:
                continue
            for other in group:
                if (other is not held and other.sent >= held.acquired
                        and other.acquired <= held.released_ok[0]):
                    violations["2 overlap"].append(
                        f"{name}: {other.wid} took the lock between {held.wid}'s acquire "
                        f"and its successful release")

    # 3. Hand-off after a release that a live, queued waiter was waiting for.
    tokens = {name: sorted(h.token for h in group) for name, group in by_name.items()}
    handoffs: list[float] = []
    direct: list[float] = []  # no dead registration may have been ahead of the live waiters
    skipped: Counter[str] = Counter()
    widened = 0
    for rel in releases:
        extra, reason = 0, ""
        for _ in range(len(waits) + 1):
            bound = (1 + extra) * (CLAIM_WINDOW + HANDOFF_MARGIN)
            horizon = rel.sent + bound
            reason, dead = _handoff_context(rel, horizon, waits, chaos, socket_timeout)
            if reason or dead == extra:
                break
            extra = dead
        if reason:
            skipped[reason] += 1
            continue
        widened += extra > 0
        later = tokens[rel.name][bisect.bisect_right(tokens[rel.name], rel.token):]
        if not later:
            violations["3 hand-off"].append(
                f"{rel.name}: released at {rel.sent:.3f} with a live waiter queued; nobody "
                f"took it afterwards")
            continue
        latency = max(holdings[rel.name, later[0]].sent - rel.sent, 0.0)
        handoffs.append(latency)
        if not extra:
            direct.append(latency)
        # The bound, whatever was queued ahead: dead registrations cost one claim
        # window in all (the first live waiter back after it takes the lock), not one each.
        if latency > CLAIM_WINDOW + HANDOFF_MARGIN:
            violations["3 hand-off"].append(
                f"{rel.name}: next holder {holdings[rel.name, later[0]].wid} sent its taking "
                f"call {latency:.3f}s after the release of token {rel.token} "
                f"(bound {CLAIM_WINDOW + HANDOFF_MARGIN:.3f}s, {extra} dead registrations)")

    # 4. Waits end near their blocking_timeout.
    overruns: dict[str, float] = {"fault-free": 0.0, "returned": 0.0, "raised": 0.0}
    longest: list[tuple[float, str]] = []  # the worst overruns, explained
    checked_waits = 0
    for wait in waits:
        if wait.end is None or math.isinf(wait.limit):
            continue
        if _stopped_during(wait.worker, wait.start, wait.end):
            continue
        checked_waits += 1
        overrun = wait.end - wait.deadline
        raised = wait.outcome not in ("0", "1")
        # After its deadline a wait makes at most one call, bounded by the socket timeout; a
        # failed wait's withdrawal runs on a thread of its own.
        allowed = socket_timeout + SCHED_MARGIN
        category = ("fault-free" if not _overlaps(faults, wait.start, wait.end + 0.01)
                    else "raised" if raised else "returned")
        overruns[category] = max(overruns[category], overrun)
        longest.append((overrun, f"{wait.wid} {wait.mode} {wait.outcome} from "
                        f"{wait.start - chaos.t0:.2f}s: {overrun:.3f}s over"))
        if overrun > allowed:
            violations["4 wait overrun"].append(
                f"{wait.wid} ({wait.mode}, blocking_timeout {wait.limit}s, {wait.outcome}) "
                f"ended {overrun:.3f}s after its deadline (allowed {allowed:.3f}s)")

    ops = Counter(w.mode for w in waits)
    outcomes = Counter(w.outcome for w in waits)
    return {
        "seed": chaos.seed,
        "workers_started": chaos.spawned,
        "operations": {
            "acquire_calls": len(waits),
            "by_mode": dict(ops),
            "acquired": len(holdings),
            "timed_out_or_busy": outcomes["0"],
            "lock_unavailable": outcomes["LockUnavailable"],
            "full_releases": len(releases),
            "holdings_whose_release_failed": sum(
                1 for h in holdings.values() if h.failed_release),
            **{k.replace(" ", "_"): v for k, v in sorted(stats.items())},
        },
        "faults": dict(chaos.faults),
        "faults_skipped": dict(chaos.skipped),
        "handoff": {
            "releases_checked": len(handoffs),
            "releases_checked_with_dead_registrations": widened,
            "releases_skipped": dict(skipped),
            "worst_s": round(max(handoffs, default=0.0), 4),
            "median_s": round(statistics.median(handoffs), 4) if handoffs else None,
            "worst_without_dead_registrations_s": round(max(direct, default=0.0), 4),
        },
        "waits": {
            "checked": checked_waits,
            "worst_overrun_s": {k: round(v, 4) for k, v in overruns.items()},
            "worst": [what for _, what in sorted(longest, reverse=True)[:3]],
        },
        "violations": {k: v for k, v in violations.items() if v},
        "t0": round(chaos.t0, 3),  # time.monotonic() of the timeline's 0, as in the logs
        "timeline": [f"{when:.2f}s {what}" for when, what in chaos.timeline],
    }


def _handoff_context(rel: Release, horizon: float, waits: list[Wait], chaos: Chaos,
                     socket_timeout: float) -> tuple[str, int]:
    """Why a release cannot be checked (or ""), and how many dead registrations may be queued
    ahead of the live waiters between the release and ``horizon``."""
    start = rel.sent - 0.1
    if _stopped_during(rel.worker, rel.sent, rel.returned):
        return "releaser stopped", 0
    if _overlaps(chaos.pauses + chaos.restarts, start, horizon):
        return "Redis paused or restarting", 0
    if horizon > chaos.observed_until:
        return "end of the run", 0
    live, dead = False, 0
    for wait in waits:
        if wait.name != rel.name or wait.start > horizon:
            continue
        ended = wait.end if wait.end is not None else math.inf
        killed = wait.worker.killed
        queues = wait.mode != "nonblock"  # a non-blocking try never queues
        if ended < start and wait.outcome in ("0", "1"):
            continue  # over, and it left the queue itself
        # Any acquire call, even a non-blocking one, killed, failing or stopped meanwhile may
        # hold the lock unseen (its call ran, its reply was lost): skip the release.
        if wait.end is None and killed is not None and killed[0] <= horizon:
            if killed[1] >= start:
                return "an acquirer was killed during the hand-off", 0
            if queues and wait.registered_until() > rel.sent:
                dead += 1  # may be queued, can never confirm
            continue
        if wait.outcome not in (None, "0", "1"):
            # A call that ran but whose reply was lost fails by its socket timeout, unless
            # the process was stopped before reading the reply.
            if start <= ended and (ended <= horizon + socket_timeout + SCHED_MARGIN
                                   or _stopped_during(wait.worker, start, ended)):
                return "an acquire failed during the hand-off", 0
            if ended < start:
                if queues and wait.registered_until() > rel.sent:
                    dead += 1  # its withdrawal may have failed too
                continue
        if _stopped_during(wait.worker, start, min(ended, horizon)):
            return "an acquirer was stopped during the hand-off", 0
        if not queues:
            continue
        if (wait.queued is not None and wait.queued <= rel.sent and wait.start <= rel.sent
                and (ended >= horizon or wait.outcome == "1") and ended >= rel.sent
                and wait.deadline >= horizon + 0.05
                and not _stopped_during(wait.worker, wait.queued, horizon)
                and not _overlaps(chaos.restarts, wait.queued, horizon)):
            live = True
    if not live:
        return "no live waiter queued", 0
    return "", dead


HANDOFFS_WANTED = 8  # hand-offs checked (check 3) before the run counts as having tried them
MOST_RUNS = 3  # a schedule heavy in pauses and restarts leaves few: another seed runs then


def chaos_run(logdir: Path, seed: int) -> dict[str, Any]:
    """One chaos run under ``seed``'s fault schedule: its figures, checked (violations listed,
    not asserted)."""
    from django_redislua.conf import settings as redislua_settings

    began = now()
    logdir.mkdir()
    chaos = Chaos(logdir, seed)
    try:
        for _ in range(WORKERS):
            chaos.spawn()
        ready_by = now() + 20
        while not all(w.ready for w in chaos.workers):
            assert now() < ready_by, "the workers did not start within 20 s"
            chaos.poll()
            time.sleep(0.05)
        # Leave room for draining (8 s) and checking within WALL_LIMIT.
        chaos_seconds = min(24.0, WALL_LIMIT - (now() - began) - CALM - 8.0 - 6.0)
        chaos.run(chaos_seconds)
        chaos.observed_until = chaos.drain(8.0)
        figures = check(chaos, redislua_settings.SOCKET_TIMEOUT or 0.0)
    finally:
        chaos.close()
    figures["wall_seconds"] = round(now() - began, 1)
    print("\nchaos figures:", json.dumps(figures, indent=2))
    return figures


def test_locks_under_chaos(tmp_path: Path) -> None:
    """Every run's invariants hold; and enough hand-offs were checked in all (a random schedule
    that paused or restarted Redis through most releases leaves too few in one run: seen once,
    7 of 8, with 25 releases skipped as 'Redis paused or restarting'; another seed runs then)."""
    seed = int(os.environ.get("CHAOS_SEED", random.randrange(2**32)))
    runs: list[dict[str, Any]] = []
    while len(runs) < MOST_RUNS and (not runs or sum(
            f["handoff"]["releases_checked"] for f in runs) < HANDOFFS_WANTED):
        figures = chaos_run(tmp_path / f"run{len(runs)}", seed + len(runs))
        FIGURES_PATH.write_text(json.dumps(figures, indent=2))
        runs.append(figures)
        assert figures["operations"]["acquired"] >= 60, "too little lock work was done"
        assert sum(figures["faults"].values()) >= 12, f"too few faults: {figures['faults']}"
        assert not figures["violations"], json.dumps(figures["violations"], indent=2)
        assert figures["wall_seconds"] < WALL_LIMIT
    checked = [f["handoff"]["releases_checked"] for f in runs]
    assert sum(checked) >= HANDOFFS_WANTED, [f["handoff"] for f in runs]


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    _worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
