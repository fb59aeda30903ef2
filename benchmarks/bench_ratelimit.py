"""Rate-limit benchmark: our ``Policy.hit`` per algorithm and its peers, against a bare INCR.

    .venv/bin/python benchmarks/bench_ratelimit.py [--rounds 40] [--batch 200] [--max-seconds 300]

Uses REDIS_URL if set, else starts its own loopback server (django_redislua.testing.RedisServer).
Every contender talks redis-py + hiredis over the same loopback TCP, in the same process and run:

- ``INCR``: a bare ``INCR`` round trip on our own client; the baseline.
- ``EVALSHA TIME only``: a script that only reads the server clock: the floor of any limiter
  that decides in Lua on the server's time, for scale.
- ours: ``Policy.hit`` for each of the seven algorithms.
- limits: moving window, fixed window, sliding window counter (its ``RedisStorage``).
- throttled-py: fixed window, sliding window, token bucket, leaking bucket, gcra (``RedisStore``).
- django-ratelimit: ``is_ratelimited`` (a fixed window) through a django-redis cache.
- DRF: ``UserRateThrottle.allow_request`` (a log of timestamps) through a django-redis cache.

Two measurements, both under a quota no call exhausts (every call takes the "allowed" path and
writes):

- rounds: a round runs every contender once, in a shuffled order, for ``--batch`` calls on a key
  fresh to that round. Figure: the median over rounds of its mean latency per call; ratio: the
  median over rounds of (its time / INCR's time in the same round).
- per call: ``--samples`` times, every contender is called once, in a shuffled order, each call
  timed alone. Figure: the median single-call latency; ratio: that median / INCR's median. A
  median of single calls ignores the stalls of a shared machine that a batch mean absorbs, so
  this is the steadier of the two on a noisy host.

Bounded in rounds, samples, calls and wall-clock seconds.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from django_redislua.testing import running_server

QUOTA = 1_000_000  # per hour: never exhausted by a benchmark round
Hit = Callable[[str], Any]


def setup_django(url: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_redislua"],
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}},
        REDISLUA={"CONNECTION": url, "SOCKET_TIMEOUT": 5},
        RATELIMIT_USE_CACHE="default",
        SECRET_KEY="bench",
        USE_TZ=True,
    )
    django.setup()


def contenders(url: str) -> list[tuple[str, str, Hit]]:
    """``(who, algorithm, hit(key))`` for every contender."""
    from django_redislua import Policy
    from django_redislua.connection import get_client

    client = get_client()
    found: list[tuple[str, str, Hit]] = [("redis-py", "INCR", client.incr)]
    # The floor of any Lua-based limiter: EVALSHA of a script that reads the server clock and
    # does nothing else, with as many arguments as our single-policy call sends.
    clock_only = client.script_load("redis.call('TIME') return {1, 0, 0, 0}")
    found.append(("redis-py", "EVALSHA TIME only", lambda key: client.evalsha(
        clock_only, 1, key, "hit", "", "gc", QUOTA, 3600, 1, "")))
    for algorithm in ("fixed_window", "sliding_window", "sliding_log", "token_bucket",
                      "leaky_bucket", "gcra"):
        policy = Policy(f"bench_{algorithm}", rate=f"{QUOTA}/h", algorithm=algorithm)
        found.append(("django-redislua", algorithm, policy.hit))
    slots = Policy("bench_concurrency", algorithm="concurrency", limit=QUOTA, timeout="1h")
    found.append(("django-redislua", "concurrency", slots.hit))
    found += limits_contenders(url) + throttled_contenders(url) + django_contenders()
    return found


def limits_contenders(url: str) -> list[tuple[str, str, Hit]]:
    from limits import parse, storage, strategies

    store = storage.RedisStorage(url)
    quota = parse(f"{QUOTA}/hour")
    found: list[tuple[str, str, Hit]] = []
    for algorithm, strategy in (
        ("sliding_log", strategies.MovingWindowRateLimiter),
        ("fixed_window", strategies.FixedWindowRateLimiter),
        ("sliding_window", strategies.SlidingWindowCounterRateLimiter),
    ):
        limiter = strategy(store)
        found.append(("limits", algorithm, lambda key, lim=limiter: lim.hit(quota, key)))
    return found


def throttled_contenders(url: str) -> list[tuple[str, str, Hit]]:
    from throttled import RedisStore, Throttled, per_hour

    store = RedisStore(server=url)
    found: list[tuple[str, str, Hit]] = []
    for algorithm, using in (
        ("fixed_window", "fixed_window"),
        ("sliding_window", "sliding_window"),
        ("token_bucket", "token_bucket"),
        ("leaky_bucket", "leaking_bucket"),
        ("gcra", "gcra"),
    ):
        throttle = Throttled(using=using, quota=per_hour(QUOTA), store=store)
        found.append(("throttled-py", algorithm, lambda key, t=throttle: t.limit(key)))
    return found


def django_contenders() -> list[tuple[str, str, Hit]]:
    from django.contrib.auth.models import AnonymousUser
    from django.core.cache import caches
    from django.test import RequestFactory
    from django_ratelimit.core import is_ratelimited
    from rest_framework.throttling import UserRateThrottle

    factory = RequestFactory()
    requests: dict[str, Any] = {}

    def request_for(key: str) -> Any:
        # Built once per key, outside the timed work: only the limiter's own cost is measured.
        if key not in requests:
            requests.clear()
            requests[key] = factory.get("/", REMOTE_ADDR=key)
            requests[key].user = AnonymousUser()
        return requests[key]

    def remote_addr(group: str, request: Any) -> str:
        return str(request.META["REMOTE_ADDR"])

    def django_ratelimit_hit(key: str) -> bool:
        return is_ratelimited(
            request_for(key), group="bench", key=remote_addr, rate=f"{QUOTA}/h", increment=True
        )

    class Throttle(UserRateThrottle):
        cache = caches["default"]
        rate = f"{QUOTA}/hour"

    throttle = Throttle()

    def drf_hit(key: str) -> bool:
        return throttle.allow_request(request_for(key), None)  # type: ignore[arg-type]

    return [
        ("django-ratelimit", "fixed_window", django_ratelimit_hit),
        ("DRF", "sliding_log", drf_hit),
    ]


def per_call_medians(found: list[tuple[str, str, Hit]], samples: int,
                     deadline: float) -> tuple[list[float], int]:
    """Median single-call latency of every contender, calls interleaved in shuffled order."""
    latencies: list[list[int]] = [[] for _ in found]
    keys = [f"bench:calls:{index}" for index in range(len(found))]
    order = list(range(len(found)))
    clock = time.perf_counter_ns
    taken = 0
    for _ in range(samples):
        if time.monotonic() > deadline:
            break
        random.shuffle(order)
        for index in order:
            hit, key = found[index][2], keys[index]
            start = clock()
            hit(key)
            latencies[index].append(clock() - start)
        taken += 1
    return [statistics.median(values) / 1000 for values in latencies], taken


def run(rounds: int, batch: int, samples: int, max_seconds: float) -> list[dict[str, Any]]:
    with running_server() as url:
        setup_django(url)
        found = contenders(url)
        for index, (_who, _algorithm, hit) in enumerate(found):  # connections, script loads
            for i in range(20):
                hit(f"warm:{index}:{i}")
        per_call: dict[int, list[float]] = {i: [] for i in range(len(found))}
        ratios: dict[int, list[float]] = {i: [] for i in range(len(found))}
        deadline = time.monotonic() + max_seconds
        order = list(range(len(found)))
        done = 0
        for round_no in range(rounds):
            if time.monotonic() > deadline:
                break
            random.shuffle(order)
            this_round: dict[int, float] = {}
            for index in order:
                hit = found[index][2]
                key = f"bench:{round_no}:{index}:10.0.{round_no % 250}.{index}"
                start = time.perf_counter()
                for _ in range(batch):
                    hit(key)
                this_round[index] = (time.perf_counter() - start) / batch
            for index, seconds in this_round.items():
                per_call[index].append(seconds)
                ratios[index].append(seconds / this_round[0])
            done += 1
        single, taken = per_call_medians(found, samples, time.monotonic() + max_seconds)
        return [
            {
                "who": who, "algorithm": algorithm, "rounds": done, "samples": taken,
                "median_us": statistics.median(per_call[i]) * 1e6,
                "ratio": statistics.median(ratios[i]),
                "call_us": single[i],
                "call_ratio": single[i] / single[0],
            }
            for i, (who, algorithm, _hit) in enumerate(found)
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--samples", type=int, default=1500)
    parser.add_argument("--max-seconds", type=float, default=300.0)
    options = parser.parse_args(argv)
    results = run(options.rounds, options.batch, options.samples, options.max_seconds)
    import redis

    print(f"# {platform.node()} {platform.machine()} {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, redis-py {redis.__version__}, "
          f"hiredis {'yes' if redis.utils.HIREDIS_AVAILABLE else 'no'}, "
          f"{results[0]['rounds']} rounds x {options.batch} calls, "
          f"{results[0]['samples']} per-call samples")
    print(f"{'algorithm':<18} {'library':<18} {'rounds: us':>10} {'x INCR':>7} "
          f"{'per call: us':>13} {'x INCR':>7}")
    results.sort(key=lambda row: (row["who"] != "redis-py", row["algorithm"], row["call_ratio"]))
    for row in results:
        print(f"{row['algorithm']:<18} {row['who']:<18} {row['median_us']:>10.1f} "
              f"{row['ratio']:>7.3f} {row['call_us']:>13.1f} {row['call_ratio']:>7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
