"""Lock benchmark: hand-off, uncontended acquire+release and contention, against peers, one run.

    .venv/bin/python benchmarks/bench_locks.py [--handoffs 50] [--process-handoffs 30]
        [--cycles 2000] [--rounds 9] [--threads 8] [--round-seconds 1] [--per-thread 2000]
        [--reference]

Uses REDIS_URL if set, else starts its own loopback server (django_redislua.testing.RedisServer).
Peers in the same process and run: our ``Lock``, redis-py's ``Lock`` (default 0.1 s sleep between
tries) and python-redis-lock (BLPOP wake-up). Peers are interleaved in a shuffled order (seeded)
trial by trial and round by round, so drift of a shared machine hits them alike. Every part is
bounded in count, and the contention rounds in time too; figures are medians.

- hand-off: a waiter thread blocks on a held lock; the holder releases; time from the start of
  the release call to the waiter's acquire returning, on one monotonic clock. The release comes
  once the waiter is parked on the server (ours: in the lock's queue; python-redis-lock: in
  BLPOP), plus 20 ms; redis-py's waiter cannot be seen (it sleeps between tries), so its release
  comes at a random point of its 0.1 s sleep and its figure is about half that sleep.
- hand-off across processes (``--process-handoffs``, ours and python-redis-lock): the same
  with the waiter in a process of its own, as on app servers (no GIL shared with the holder);
  one waiter process per peer, started once, given each trial's lock name.
- hand-off commands: the same, once, under MONITOR: every command the server received from the
  start of the release to the waiter's acquire returning (markers bound the window).
- uncontended: acquire then release of a free lock, timed alone; its commands under MONITOR.
- contention: ``--threads`` threads loop acquire / tiny critical section / release on one lock
  name for ``--round-seconds`` (a round also ends after ``--threads * --per-thread``
  acquisitions, a safety bound no peer reaches with the defaults). One second is ten of redis-py's
  0.1 s sleeps, so its waiters get their chances. Per round: acquisitions per second, the fewest
  and most acquisitions of one thread, and the p50 / p99 / max wait of an acquire (an acquire
  still waiting when the round ends counts with its wait so far). Figures: medians over
  ``--rounds`` rounds. Overlapping holders are counted (must be 0).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from django_redislua.testing import running_server

SEED = 20240601
SETTLE = 0.02  # after the waiter is parked on the server, for it to sit in its blocking read


REFERENCE_ENV = "REDISLUA_BENCH_REFERENCE"


def setup_django(url: str) -> None:
    import django
    from django.conf import settings

    settings.configure(INSTALLED_APPS=["django_redislua"],
                       REDISLUA={"CONNECTION": url, "SOCKET_TIMEOUT": 5,
                                 "METRICS": [],  # the peers record none
                                 # --reference: ours without the lean transport
                                 "LEAN_CALLS": os.environ.get(REFERENCE_ENV) != "1"})
    django.setup()


# A peer's (acquire, release) for one lock object called name; acquire blocks.
Pair = tuple[Callable[[], Any], Callable[[], Any]]


@dataclass
class Peer:
    label: str
    make: Callable[[str], Pair]
    # Whether a waiter on the lock called name is parked on the server now; None: nothing to see.
    parked: Callable[[str], bool] | None
    handoff_trials: int = 0


def peers(client: Any, handoffs: int) -> list[Peer]:
    import redis_lock  # type: ignore[import-untyped]

    from django_redislua.locks import Lock
    from django_redislua.locks.keys import keys_for

    def ours(name: str) -> Pair:
        lock = Lock(name, timeout=30)
        return lock.acquire, lock.release

    def ours_parked(name: str) -> bool:
        return int(client.zcard(keys_for("lock", name).sub("queue"))) > 0

    def redis_py(name: str) -> Pair:
        lock = client.lock(name, timeout=30, thread_local=False)  # released by another thread
        return lock.acquire, lock.release

    def python_redis_lock(name: str) -> Pair:
        lock = redis_lock.Lock(client, name, expire=30)
        return lock.acquire, lock.release

    def blpop_parked(name: str) -> bool:
        return int(client.info("clients")["blocked_clients"]) > 0

    return [
        Peer("django-redislua Lock", ours, ours_parked, handoffs),
        # Each redis-py trial costs ~0.1 s of its sleep: fewer trials keep the run short.
        Peer("redis-py Lock", redis_py, None, min(handoffs, 20)),
        Peer("python-redis-lock", python_redis_lock, blpop_parked, handoffs),
    ]


def wait_parked(peer: Peer, name: str, rng: random.Random) -> None:
    """Return once the waiter on ``name`` is blocked (or, for a poller, at a random phase)."""
    if peer.parked is None:
        time.sleep(0.03 + rng.random() * 0.1)  # the waiter tried at once, then sleeps 0.1 s
        return
    give_up = time.monotonic() + 5
    while not peer.parked(name):
        if time.monotonic() > give_up:
            raise RuntimeError(f"{peer.label}: the waiter never parked")
        time.sleep(0.001)
    time.sleep(SETTLE)


def one_handoff(peer: Peer, name: str, rng: random.Random,
                before: Callable[[], Any] = lambda: None,
                after: Callable[[], Any] = lambda: None) -> float:
    """Milliseconds from the start of the release to the waiter's acquire returning."""
    hold, release = peer.make(name)
    hold()
    wait, done = peer.make(name)
    acquired_at: list[float] = []

    def waiter() -> None:
        wait()
        acquired_at.append(time.perf_counter())
        after()

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_parked(peer, name, rng)
    before()
    released_at = time.perf_counter()
    release()
    thread.join(10)
    if not acquired_at:
        raise RuntimeError(f"{peer.label}: the waiter did not get the lock")
    done()
    return (acquired_at[0] - released_at) * 1000


def handoffs_ms(all_peers: list[Peer], rng: random.Random) -> dict[str, float]:
    """Median hand-off per peer, trials interleaved across peers in a shuffled order."""
    latencies: dict[str, list[float]] = {peer.label: [] for peer in all_peers}
    for trial in range(max(peer.handoff_trials for peer in all_peers)):
        order = [peer for peer in all_peers if trial < peer.handoff_trials]
        rng.shuffle(order)
        for peer in order:
            latencies[peer.label].append(one_handoff(peer, f"bench:handoff:{trial}", rng))
    return {label: statistics.median(values) for label, values in latencies.items()}


def _process_waiter(url: str, label: str, names: Any, acquired: Any) -> None:
    """A waiter in a process of its own (as app servers are): for each lock name it is given,
    acquire (blocking: the main process holds it), say when, release."""
    setup_django(url)
    from django_redislua.connection import get_client

    peer = next(p for p in peers(get_client(), 1) if p.label == label)
    for name in iter(names.get, None):
        wait, done = peer.make(name)
        wait()
        acquired.put(time.perf_counter())
        done()


def process_handoffs_ms(all_peers: list[Peer], url: str, trials: int,
                        rng: random.Random) -> dict[str, float]:
    """Median hand-off with the waiter in another process: from the start of the release to
    the waiter's acquire returning, on the system-wide monotonic clock (perf_counter). Peers
    that can be seen parked only (a poller's figure is its sleep)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    seen = [peer for peer in all_peers if peer.parked is not None]
    workers = {}
    for peer in seen:
        names, acquired = context.Queue(), context.Queue()
        process = context.Process(target=_process_waiter,
                                  args=(url, peer.label, names, acquired), daemon=True)
        process.start()
        workers[peer.label] = (process, names, acquired)
    latencies: dict[str, list[float]] = {peer.label: [] for peer in seen}
    try:
        for trial in range(trials):
            order = list(seen)
            rng.shuffle(order)
            for peer in order:
                _process, names, acquired = workers[peer.label]
                name = f"bench:process-handoff:{trial}"
                hold, release = peer.make(name)
                hold()
                names.put(name)
                wait_parked(peer, name, rng)
                released_at = time.perf_counter()
                release()
                latencies[peer.label].append((acquired.get(timeout=10) - released_at) * 1000)
    finally:
        for process, names, _acquired in workers.values():
            names.put(None)
            process.join(10)
            if process.is_alive():
                process.kill()
    return {label: statistics.median(values) for label, values in latencies.items()}


def uncontended_us(all_peers: list[Peer], cycles: int, rng: random.Random) -> dict[str, float]:
    """Median of single acquire+release timings, blocks of 100 interleaved across peers."""
    timings: dict[str, list[float]] = {peer.label: [] for peer in all_peers}
    block = 100
    for start in range(0, cycles, block):
        order = list(all_peers)
        rng.shuffle(order)
        for peer in order:
            for cycle in range(start, min(start + block, cycles)):
                acquire, release = peer.make(f"bench:free:{cycle % 50}")
                started = time.perf_counter()
                acquire()
                release()
                timings[peer.label].append((time.perf_counter() - started) * 1_000_000)
    return {label: statistics.median(values) for label, values in timings.items()}


def uncontended_commands(client: Any, peer: Peer) -> list[str]:
    from django_redislua.testing import CommandRecorder

    acquire, release = peer.make("bench:rt:warm")
    acquire()
    release()  # scripts loaded, connections open
    acquire, release = peer.make("bench:rt")
    with CommandRecorder(client) as recorder:
        acquire()
        release()
    return recorder.commands


def handoff_commands(client: Any, peer: Peer, rng: random.Random) -> list[str]:
    """The commands the server received from the start of a release to the waiter's acquire
    returning: ECHO markers bound the window (the closing one 20 ms after the return, so what the
    waiter sent on another connection just before it has arrived)."""
    from django_redislua.testing import CommandRecorder

    def acquired() -> None:
        time.sleep(0.02)
        client.echo("bench-acquired")

    one_handoff(peer, "bench:rt:handoff:warm", rng)  # this thread's connections open
    with CommandRecorder(client) as recorder:
        one_handoff(peer, "bench:rt:handoff", rng,
                    before=lambda: client.echo("bench-release"),
                    after=acquired)
    commands = [str(e["command"]) for e in recorder.entries if e.get("client_type") != "lua"]
    first = commands.index("ECHO bench-release")
    last = commands.index("ECHO bench-acquired")
    return [c.split(" ", 1)[0].upper() for c in commands[first + 1:last]]


@dataclass
class RoundResult:
    per_second: float
    fewest: int
    most: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    overlaps: int


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def contention_round(peer: Peer, name: str, threads: int, budget: int,
                     seconds: float) -> RoundResult:
    """``threads`` threads take the lock in turn until ``budget`` acquisitions or ``seconds``."""
    start = threading.Barrier(threads + 1)
    stop = threading.Event()
    inside = threading.Lock()  # taken without blocking in the critical section: overlap check
    counts = [0] * threads
    waits: list[list[float]] = [[] for _ in range(threads)]
    pending: list[float | None] = [None] * threads
    taken = [0]
    overlaps = [0]
    ended = [0.0]
    ending = threading.Lock()
    late: list[float] = []  # acquires still waiting when the round ended: their wait so far

    def worker(index: int) -> None:
        acquire, release = peer.make(name)
        start.wait()
        while True:
            began = time.perf_counter()
            pending[index] = began
            acquire()
            got = time.perf_counter()
            pending[index] = None
            try:
                if stop.is_set():
                    return  # the round is over: drained, not counted
                if not inside.acquire(blocking=False):  # someone else is in here too
                    overlaps[0] += 1
                    continue
                try:
                    counts[index] += 1
                    waits[index].append((got - began) * 1000)
                    taken[0] += 1
                    if taken[0] >= budget:
                        finish()  # while holding the lock: nobody else can return meanwhile
                finally:
                    inside.release()
            finally:
                release()

    def finish() -> None:
        with ending:  # the budget reached by a worker and the time limit may come together
            if not stop.is_set():
                ended[0] = time.perf_counter()
                late.extend(ended[0] - at for at in list(pending) if at is not None)
                stop.set()

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in workers:
        thread.start()
    start.wait()
    began = time.perf_counter()
    if not stop.wait(seconds):
        finish()
    for thread in workers:
        thread.join(60)
    all_waits = [w for per_thread in waits for w in per_thread] + [w * 1000 for w in late]
    return RoundResult(sum(counts) / (ended[0] - began), min(counts), max(counts),
                       percentile(all_waits, 0.50), percentile(all_waits, 0.99), max(all_waits),
                       overlaps[0])


def contention(all_peers: list[Peer], rounds: int, threads: int, per_thread: int,
               seconds: float, rng: random.Random) -> dict[str, list[RoundResult]]:
    results: dict[str, list[RoundResult]] = {peer.label: [] for peer in all_peers}
    for round_index in range(rounds):
        order = list(all_peers)
        rng.shuffle(order)
        for peer in order:
            results[peer.label].append(contention_round(
                peer, f"bench:contended:{round_index}", threads, threads * per_thread, seconds))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--handoffs", type=int, default=50,
                        help="hand-off trials per peer (redis-py: at most 20)")
    parser.add_argument("--cycles", type=int, default=2000, help="uncontended cycles per peer")
    parser.add_argument("--rounds", type=int, default=9, help="contention rounds per peer")
    parser.add_argument("--threads", type=int, default=8, help="contending threads")
    parser.add_argument("--round-seconds", type=float, default=1.0,
                        help="length of a contention round")
    parser.add_argument("--per-thread", type=int, default=2000,
                        help="... unless threads x this many acquisitions come first")
    parser.add_argument("--process-handoffs", type=int, default=30,
                        help="hand-off trials with the waiter in another process (0: none)")
    parser.add_argument("--reference", action="store_true",
                        help="ours on the reference transport (REDISLUA LEAN_CALLS=False)")
    options = parser.parse_args()
    if options.reference:
        os.environ[REFERENCE_ENV] = "1"
    rng = random.Random(SEED)
    began = time.monotonic()
    with running_server() as url:
        setup_django(url)
        import redis
        import redis_lock

        from django_redislua.connection import get_client

        client = get_client()
        all_peers = peers(client, options.handoffs)
        commands = {peer.label: (uncontended_commands(client, peer),
                                 handoff_commands(client, peer, rng)) for peer in all_peers}
        handoff = handoffs_ms(all_peers, rng)
        across = (process_handoffs_ms(all_peers, url, options.process_handoffs, rng)
                  if options.process_handoffs else {})
        cycle = uncontended_us(all_peers, options.cycles, rng)
        contended = contention(all_peers, options.rounds, options.threads, options.per_thread,
                               options.round_seconds, rng)
        server = client.info("server")["redis_version"]
    load = os.getloadavg()
    print(f"# {platform.machine()} {os.cpu_count()} CPUs, load {load[0]:.2f} {load[1]:.2f}, "
          f"Python {platform.python_version()}, redis-py {redis.__version__} "
          f"(hiredis {'yes' if redis.utils.HIREDIS_AVAILABLE else 'no'}), "
          f"python-redis-lock {redis_lock.__version__}, "
          f"redis-server {server} at {url}, {time.monotonic() - began:.0f} s")
    print(f"# hand-off trials {options.handoffs} (redis-py {min(options.handoffs, 20)}), "
          f"cycles {options.cycles}, contention {options.rounds} rounds x {options.threads} "
          f"threads x {options.round_seconds:g} s (at most {options.per_thread} per thread)")
    ours = all_peers[0].label

    def short(names: list[str]) -> str:
        return " ".join(names) or "-"

    print(f"\n{'peer':<22} {'hand-off ms':>11} {'vs ours':>8} {'acq+rel us':>10} {'vs ours':>8}")
    for peer in all_peers:
        label = peer.label
        print(f"{label:<22} {handoff[label]:>11.3f} {handoff[label] / handoff[ours]:>7.2f}x "
              f"{cycle[label]:>10.0f} {cycle[label] / cycle[ours]:>7.2f}x")
    if across:
        print(f"\n{'peer':<22} {'hand-off ms, waiter in another process':>40} {'vs ours':>8}"
              f"   ({options.process_handoffs} trials)")
        for label, value in across.items():
            print(f"{label:<22} {value:>40.3f} {value / across[ours]:>7.2f}x")
    print(f"\n{'peer':<22} commands (MONITOR)")
    for peer in all_peers:
        uncontended, handed = commands[peer.label]
        print(f"{peer.label:<22} acquire+release: {short(uncontended)}; "
              f"hand-off: {short(handed)}")
    print(f"\n{'peer':<22} {'acq/s':>7} {'vs ours':>8} {'fewest':>7} {'most':>5} "
          f"{'p50 ms':>7} {'p99 ms':>8} {'max ms':>8} {'overlaps':>8}   (medians of rounds)")
    median_per_second = statistics.median(r.per_second for r in contended[ours])
    for peer in all_peers:
        rows = contended[peer.label]

        def med(field: str, rows: list[RoundResult] = rows) -> float:
            return float(statistics.median(getattr(r, field) for r in rows))

        print(f"{peer.label:<22} {med('per_second'):>7.0f} "
              f"{med('per_second') / median_per_second:>7.2f}x {med('fewest'):>7.0f} "
              f"{med('most'):>5.0f} {med('p50_ms'):>7.2f} {med('p99_ms'):>8.2f} "
              f"{med('max_ms'):>8.1f} {sum(r.overlaps for r in rows):>8}")
        print(f"{'':<22} rounds: " + "; ".join(
            f"{r.per_second:.0f}/s {r.fewest}-{r.most} p99 {r.p99_ms:.1f}" for r in rows))


if __name__ == "__main__":
    main()
