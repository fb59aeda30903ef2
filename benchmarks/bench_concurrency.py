"""Many decisions in flight at once (issue 39): asyncio tasks in one process, one run, every
contender on the allowed path with its own keys.

    .venv/bin/python benchmarks/bench_concurrency.py [--tasks 64] [--seconds 1.5] [--rounds 5]
        [--tail-rounds 3] [--cluster] [--json PATH]

Uses REDIS_URL if set (loopback only), else starts its own loopback server; ``--cluster``
starts a 3-primary Redis Cluster instead (no replicas), where the peers are left out, the
bare ``INCR`` goes to its key's primary (:func:`routed_incr`), and Redis's CPU is every
primary's.
Contenders, each
with ``--tasks`` asyncio tasks, every task cycling through identities of its own under a quota
no call exhausts:

- a bare redis-py asyncio ``INCR`` (one ``redis.asyncio.Redis``, its default pool): the floor
  every ratio is taken against;
- ours, ``Policy.ahit``, fixed window and GCRA, with automatic pipelining (``PIPELINING``, the
  default) and without it (``PIPELINING = False``: a connection per call); on redis-py 8.1,
  also the fixed window pipelined through redis-py's connection methods (``send_packed_command``
  and ``read_response``) instead of the connection's stream and parser (django_redislua/
  direct.py), the path before commit 0ec2590 and on older redis-py;
- throttled-py's asyncio ``Throttled`` (fixed window, GCRA) and limits' ``limits.aio`` (fixed
  window, sliding window counter), when installed (``python3 dev.py bench`` installs them).

One round measures every contender for ``--seconds`` each, in a shuffled (seeded) order; the
figures are medians over ``--rounds`` rounds: decisions/s, its ratio to ``INCR`` within the same
round, and the Redis main thread's CPU per decision (``INFO cpu``: ``used_cpu_*_main_thread``,
or the process's where the server has no per-thread figure). Then one decision alone: the
median latency of ``--lone`` sequential calls of each, as a ratio to a lone ``INCR``, and where
it goes: the client's CPU per call (``time.process_time``) and the server's time executing the
call's commands (``INFO commandstats``: a script's, and what it calls). Then the
tail: the p99 latency of one call with ``--tasks`` in flight, ``--tail-rounds`` rounds of
``--seconds`` (medians), for ours, pipelined and not, and ``INCR``. Every loop is bounded by
count and by time.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_ratelimit import check_loopback

Call = Callable[[str], Awaitable[Any]]
QUOTA = 10**9  # no call is ever denied: the allowed path only


@dataclass
class Contender:
    name: str
    make: Callable[[], Call]  # called on the benchmark's loop: clients belong to a loop
    pipelining: bool | None = None  # ours: the PIPELINING setting it runs with
    stream: bool = True  # ours: the shared connection on the stream (direct.STREAM_API)


def setup_django(url: str) -> None:
    import django
    from django.conf import settings

    settings.configure(INSTALLED_APPS=["django_redislua"],
                       REDISLUA={"CONNECTION": url, "METRICS": []})
    django.setup()


def contenders(url: str, cluster: bool) -> list[Contender]:
    import redis.asyncio

    from django_redislua import Policy

    def bare_incr() -> Call:
        if cluster:
            return routed_incr(url)
        client = redis.asyncio.Redis.from_url(url)
        return client.incr

    def ours(algorithm: str) -> Callable[[], Call]:
        def make() -> Call:
            return Policy(f"bench-{algorithm}", rate=f"{QUOTA}/h", algorithm=algorithm).ahit
        return make

    found = [Contender("redis-py INCR", bare_incr)]
    for algorithm in ("fixed_window", "gcra"):
        found.append(Contender(f"ours {algorithm}", ours(algorithm), pipelining=True))
        found.append(Contender(f"ours {algorithm}, PIPELINING=False", ours(algorithm),
                               pipelining=False))
    from django_redislua import direct

    if direct.STREAM_API:
        found.append(Contender("ours fixed_window, redis-py's methods", ours("fixed_window"),
                               pipelining=True, stream=False))
    if not cluster:
        found += throttled_peers(url) + limits_peers(url)
    return found


def routed_incr(url: str) -> Call:
    """A bare ``INCR`` on a cluster: each sent by a ``redis.asyncio.Redis`` of its key's
    primary, found in redis-py's slot table. (redis-py 8.1's asyncio ``RedisCluster`` failed
    here under 64 concurrent calls: a connection written before it was connected.)"""
    import redis.asyncio
    import redis.cluster

    router = redis.cluster.RedisCluster.from_url(plain(url))
    clients = {node.name: redis.asyncio.Redis(host=node.host, port=node.port)
               for node in router.get_primaries()}

    def incr(key: str) -> Awaitable[Any]:
        return clients[router.get_node_from_key(key).name].incr(key)
    return incr


def plain(url: str) -> str:
    """A cluster's URL as redis-py takes it (ours names the kind in its scheme)."""
    return url.replace("redis+cluster://", "redis://", 1)


def throttled_peers(url: str) -> list[Contender]:
    try:
        from throttled.asyncio import RedisStore, Throttled, per_hour
    except ImportError:
        return []

    def make(using: str) -> Callable[[], Call]:
        def made() -> Call:
            throttle = Throttled(using=using, quota=per_hour(QUOTA),
                                 store=RedisStore(server=url))
            return throttle.limit
        return made

    return [Contender(f"throttled-py asyncio {using}", make(using))
            for using in ("fixed_window", "gcra")]


def limits_peers(url: str) -> list[Contender]:
    try:
        from limits import parse
        from limits.aio import storage, strategies
    except ImportError:
        return []
    quota = parse(f"{QUOTA}/hour")

    def make(strategy: Any) -> Callable[[], Call]:
        def made() -> Call:
            limiter = strategy(storage.RedisStorage(f"async+{url}", implementation="redispy"))
            return lambda key: limiter.hit(quota, key)
        return made

    return [Contender(f"limits.aio {name}", make(strategy)) for name, strategy in (
        ("fixed window", strategies.FixedWindowRateLimiter),
        ("sliding counter", strategies.SlidingWindowCounterRateLimiter))]


def server_cpu(clients: list[Any]) -> float:
    """Seconds of CPU the servers' main threads have used (each primary's, on a cluster)."""
    used = 0.0
    for client in clients:
        info = client.info("cpu")
        if "used_cpu_user_main_thread" in info:
            used += (float(info["used_cpu_user_main_thread"])
                     + float(info["used_cpu_sys_main_thread"]))
        else:
            used += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return used


async def rate(call: Call, tasks: int, seconds: float, tag: str) -> int:
    """Decisions made by ``tasks`` tasks in ``seconds`` (each at most 10**6)."""
    deadline = time.perf_counter() + seconds

    async def worker(i: int) -> int:
        done = 0
        names = [f"{tag}:{i}:{n}" for n in range(16)]
        for name in itertools.islice(itertools.cycle(names), 10**6):
            await call(name)
            done += 1
            if done % 16 == 0 and time.perf_counter() >= deadline:
                break
        return done

    return sum(await asyncio.gather(*(worker(i) for i in range(tasks))))


async def lone(call: Call, count: int, tag: str) -> float:
    """The median latency (us) of ``count`` sequential calls."""
    times = []
    for n in range(count):
        start = time.perf_counter()
        await call(f"{tag}:lone:{n % 16}")
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def commands_us(servers: list[Any]) -> float:
    """Microseconds the servers have spent executing commands (INFO commandstats), the
    benchmark's own INFO calls left out."""
    total = 0.0
    for client in servers:
        for name, stats in client.info("commandstats").items():
            if not name.startswith(("cmdstat_info", "cmdstat_config")):
                total += float(stats["usec"])
    return total


async def tail(call: Call, tasks: int, seconds: float, tag: str) -> float:
    """The p99 latency (us) of one call while ``tasks`` tasks call for ``seconds`` (each at
    most 10**6 calls)."""
    deadline = time.perf_counter() + seconds
    times: list[float] = []

    async def worker(i: int) -> None:
        names = [f"{tag}:{i}:{n}" for n in range(16)]
        for name in itertools.islice(itertools.cycle(names), 10**6):
            start = time.perf_counter()
            await call(name)
            end = time.perf_counter()
            times.append(end - start)
            if end >= deadline:
                break

    await asyncio.gather(*(worker(i) for i in range(tasks)))
    return statistics.quantiles(times, n=100)[98] * 1e6


@contextmanager
def switched(contender: Contender) -> Iterator[None]:
    """The settings (and the shared connection's I/O) ``contender`` runs with: a settings
    change builds the transports again, so each gets its own."""
    from django.conf import settings
    from django.test import override_settings

    from django_redislua import direct

    if contender.pipelining is None:
        yield
        return
    streamed = direct.STREAM_API
    direct.STREAM_API = streamed and contender.stream
    try:
        with override_settings(REDISLUA={**settings.REDISLUA,
                                         "PIPELINING": contender.pipelining}):
            yield
    finally:
        direct.STREAM_API = streamed


async def measure(found: list[Contender], args: argparse.Namespace, servers: list[Any]
                  ) -> dict[str, Any]:
    rng = random.Random(args.seed)
    rounds: list[dict[str, dict[str, float]]] = []
    for round_ in range(args.rounds):
        order = list(found)
        rng.shuffle(order)
        got: dict[str, dict[str, float]] = {}
        for contender in order:
            with switched(contender):
                call = contender.make()
                await rate(call, args.tasks, 0.2, f"warm{round_}")  # connections, scripts
                cpu = server_cpu(servers)
                start = time.perf_counter()
                done = await rate(call, args.tasks, args.seconds, f"r{round_}")
                elapsed = time.perf_counter() - start
                used = server_cpu(servers) - cpu
            got[contender.name] = {"per_s": done / elapsed, "server_us": used / done * 1e6}
        base = got["redis-py INCR"]["per_s"]
        for figures in got.values():
            figures["ratio"] = figures["per_s"] / base
        rounds.append(got)
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    lone_us: dict[str, list[float]] = {contender.name: [] for contender in found}
    lone_cpu: dict[str, list[float]] = {contender.name: [] for contender in found}
    lone_server: dict[str, list[float]] = {contender.name: [] for contender in found}
    for _ in range(3):
        for contender in found:
            with switched(contender):
                call = contender.make()
                await lone(call, 50, "lonewarm")
                cpu, executed = time.process_time(), commands_us(servers)
                lone_us[contender.name].append(await lone(call, args.lone, "lone"))
                lone_cpu[contender.name].append((time.process_time() - cpu) / args.lone * 1e6)
                lone_server[contender.name].append(
                    (commands_us(servers) - executed) / args.lone)
    # The tail with every task in flight: ours pipelined against the per-call path (what every
    # release before pipelining did) and a bare INCR, shuffled, per round.
    tailed = [c for c in found if c.name.startswith(("ours", "redis-py"))]
    tail_us: dict[str, list[float]] = {contender.name: [] for contender in tailed}
    for round_ in range(args.tail_rounds):
        order = list(tailed)
        rng.shuffle(order)
        for contender in order:
            with switched(contender):
                call = contender.make()
                await rate(call, args.tasks, 0.2, f"tailwarm{round_}")
                tail_us[contender.name].append(
                    await tail(call, args.tasks, args.seconds, f"t{round_}"))
    results = {}
    for contender in found:
        name = contender.name
        lone_median = statistics.median(lone_us[name])
        results[name] = {
            "per_s": statistics.median(r[name]["per_s"] for r in rounds),
            "ratio": statistics.median(r[name]["ratio"] for r in rounds),
            "ratio_range": [min(r[name]["ratio"] for r in rounds),
                            max(r[name]["ratio"] for r in rounds)],
            "server_us": statistics.median(r[name]["server_us"] for r in rounds),
            "lone_us": lone_median,
            "lone_cpu_us": statistics.median(lone_cpu[name]),
            "lone_server_us": statistics.median(lone_server[name]),
            "lone_ratio": lone_median / statistics.median(lone_us["redis-py INCR"]),
        }
        if name in tail_us:
            results[name]["p99_us"] = statistics.median(tail_us[name])
    return results


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    where = " on a 3-primary cluster" if args.cluster else ""
    print(f"\n{args.tasks} asyncio tasks{where}, {args.rounds} rounds of {args.seconds:g} s each "
          f"(medians; ratio: to redis-py INCR in the same round, [min-max] over rounds; a call "
          f"alone: its latency, the client's CPU and the server's command time, us)")
    print(f"{'contender':42} {'decisions/s':>12} {'x INCR':>7} {'range':>13} "
          f"{'server us':>10} {'lone x INCR':>12} {'p99 us':>8} "
          f"{'lone us':>8} {'client':>7} {'server':>7}")
    for name, r in results.items():
        low, high = r["ratio_range"]
        p99 = f"{r['p99_us']:8,.0f}" if "p99_us" in r else f"{'':8}"
        print(f"{name:42} {r['per_s']:12,.0f} {r['ratio']:7.2f} {low:6.2f}-{high:<6.2f} "
              f"{r['server_us']:10.1f} {r['lone_ratio']:12.2f} {p99} "
              f"{r['lone_us']:8.0f} {r['lone_cpu_us']:7.0f} {r['lone_server_us']:7.1f}")
    ours = {name: r for name, r in results.items() if name.startswith("ours")
            and "PIPELINING=False" not in name and "methods" not in name}
    peers = {name: r for name, r in results.items()
             if not name.startswith(("ours", "redis-py"))}
    print("\nissue 39's criteria (this run):")
    for name, r in ours.items():
        unpipelined = results[f"{name}, PIPELINING=False"]
        checks = [
            ("x bare INCR >= 2.0", r["ratio"], r["ratio"] >= 2.0),
            ("lone x INCR <= 1.03", r["lone_ratio"], r["lone_ratio"] <= 1.03),
            ("server CPU x unpipelined <= 0.6", r["server_us"] / unpipelined["server_us"],
             r["server_us"] / unpipelined["server_us"] <= 0.6),
            ("p99 x unpipelined <= 1.0", r["p99_us"] / unpipelined["p99_us"],
             r["p99_us"] <= unpipelined["p99_us"]),
        ]
        checks += [(f"x {peer} >= 2.0", r["per_s"] / p["per_s"], r["per_s"] / p["per_s"] >= 2.0)
                   for peer, p in peers.items()]
        for what, value, ok in checks:
            print(f"  {name:22} {what:42} {value:6.2f}  {'OK' if ok else 'FAIL'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lone", type=int, default=500)
    parser.add_argument("--tail-rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument("--cluster", action="store_true",
                        help="a 3-primary Redis Cluster of its own (REDIS_URL ignored)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from django_redislua.testing import RedisClusterServers, RedisServer

    url = None if args.cluster else os.environ.get("REDIS_URL")
    server: Any = None
    if url is None:
        server = RedisClusterServers(primaries=3, replicas=0) if args.cluster else RedisServer()
        server.start()
        url = server.url
    check_loopback(url)
    try:
        setup_django(url)
        import redis

        if args.cluster:
            servers = [s.client() for s in server.servers]
        else:
            servers = [redis.Redis.from_url(url)]
        print(f"Python {platform.python_version()}, redis-py {redis.__version__}, "
              f"server {servers[0].info('server')['redis_version']}", file=sys.stderr)
        found = contenders(url, args.cluster)
        results = asyncio.run(measure(found, args, servers))
        report(results, args)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
