"""Rate-limit benchmark: every figure of issue #13 in one command and one run.

    .venv/bin/python benchmarks/bench_ratelimit.py [--quick] [--functions] [--reference]
        [--json PATH]
        [--chart PATH | --no-chart] [--max-seconds 300] [--seed N]

Uses REDIS_URL if set (loopback only), else starts its own loopback server
(django_redislua.testing.running_server). Every client is redis-py (+ hiredis when installed)
over TCP to that one server, in this process (section 5 adds worker processes). Sections:

1. Allowed path, per call: every contender is called once per sample, in a shuffled (seeded)
   order, each call timed alone (garbage collection only between blocks of 100 samples); keys
   change every ``--rotate`` samples, under a quota no call exhausts. Samples are taken until
   the section's share of ``--max-seconds`` is spent (or ``--samples``). Figure: the median
   single-call latency; ratio: that median / the median of a bare redis-py ``INCR``
   (``x INCR``), with the quartiles of the same ratio over ten blocks of the run (its noise).
   Contenders: redis-py ``INCR``; the lean floor (``INCR`` by ``send_command`` +
   ``read_response`` on a dedicated connection: the least a Python client can do); ``INCR``
   through our lean channel; a minimal ``TIME`` + ``GET`` + ``SET PX`` script through our lean
   channel with the same KEYS/ARGV as ours; ``Policy.hit`` for each of our eight algorithms;
   limits (moving window, fixed window, sliding window counter), throttled-py (fixed window,
   sliding window, token bucket, leaking bucket, GCRA), django-ratelimit (``is_ratelimited``)
   and DRF (``UserRateThrottle``) through django-redis.
2. Denied path: a flood from one identity. Every limiter gets a ``1/h`` limit on one key,
   exhausted first, then is timed per call as in 1, with ``INCR`` in the same interleaving
   (``--denied-samples`` at most). Median and mean per decision, ratio to ``INCR``, and for
   ours the share of answers given by the in-process denial cache (``Decision.local``).
3. Race: ``--race-threads`` threads behind a ``threading.Barrier`` each call ``Policy.hit`` on
   one identity of a ``10/m`` policy ``--race-calls`` times; admitted (must be 10) and local
   answers, per algorithm and trial.
4. Server time: per round, for each of our algorithms and the minimal script in shuffled order,
   ``CONFIG RESETSTAT``, ``--server-batch`` allowed calls on one key, then ``INFO
   commandstats`` (``cmdstat_evalsha``, or ``cmdstat_fcall`` with ``--functions``): microseconds
   per call. Figures: medians over rounds (as many as the section's share of time allows, at
   most ``--server-rounds``) of usec per call and of its ratio to the minimal script in the
   same round.
5. Throughput: decisions/s on the allowed path (each thread cycles through its own identities)
   of our fixed_window and gcra and of a bare ``INCR``, with 1, 8 and 32 threads in this
   process and with 4 processes (spawned, one client each, started together behind a barrier;
   rates summed). Every measurement lasts ``--seconds``; the measurements of one repetition run
   in a shuffled order; figures are medians over ``--reps`` repetitions, and the ratio to
   ``INCR`` is the median of the ratios within one repetition.

Then the acceptance criteria of issue #13 with the measured value, the threshold and OK/FAIL,
and a chart (matplotlib, Agg) of the allowed-path and denied-path ratios, ours next to the best
peer per algorithm (``--chart``, default docs/benchmark-ratelimit.png). ``--functions`` runs our
scripts (and the minimal script) as Redis Functions (``FCALL``). Every loop is bounded in count,
and by ``--max-seconds`` in all (each section gets its share of it, see SHARES): the defaults
take about 4 minutes, ``--quick`` (60 s of budget, shorter throughput runs) about 1 minute.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from django_redislua.testing import running_server  # noqa: E402

QUOTA = 1_000_000  # per hour: never exhausted by the allowed-path measurements
HOUR_US = 3_600_000_000
RATE_ALGORITHMS = ("fixed_window", "sliding_window", "sliding_log", "token_bucket",
                   "leaky_bucket", "gcra")
O1_ALGORITHMS = tuple(a for a in RATE_ALGORITHMS if a != "sliding_log")
# A calendar quota (issue 38) has no peer: it is held to the fixed window's allowed path.
OURS = (*RATE_ALGORITHMS, "calendar", "concurrency")
RACE_RATE, RACE_LIMIT = "10/m", 10
THROUGHPUT = ("INCR", "fixed_window", "gcra")
IDENTITIES = 1000  # per thread, cycled, in the throughput runs
CHECK_EVERY = 100  # samples between two looks at the clock (and garbage collections)
# Each section's share of --max-seconds, counted from its start. The sampled sections run until
# their share is spent (or their count bound is reached); the others are bounded in count and
# only skip what is left once their share is spent.
SHARES = {"allowed": 0.25, "denied": 0.12, "race": 0.05, "server": 0.13, "throughput": 0.40}
DEFAULT_CHART = ROOT / "docs" / "benchmark-ratelimit.png"

# The floor of any limiter deciding in Lua on the server's clock that keeps one string of state:
# read the clock, read the state, write it back with an expiry, reply four integers, as ours.
MIN_BODY = """local t = redis.call('TIME')
local state = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], t[1] .. ':' .. t[2], 'PX', 3600000)
return {1, 0, 0, 0}"""
MIN_LIBRARY = "benchmin"

# Thresholds of issue #13.
ALLOWED_MAX = {**dict.fromkeys(O1_ALGORITHMS, 1.00), "sliding_log": 1.10}
PEER_MAX = 0.85
DENIED_MAX = 0.25
SERVER_MAX = 1.25
# A calendar quota's allowed path: a fixed window's, within 1% (less than the spread of one
# contender's own blocks; benchmarks/bench_calendar.py measures the difference alone).
CALENDAR_MAX = 1.01

Call = Callable[[str], Any]


@dataclass
class Contender:
    label: str  # unique, printed
    who: str  # "baseline", "ours" or the peer library
    algorithm: str
    call: Call


@dataclass
class Settings:
    samples: int
    denied_samples: int
    rotate: int
    race_threads: int
    race_calls: int
    race_trials: int
    race_algorithms: tuple[str, ...]
    server_rounds: int
    server_batch: int
    seconds: float
    reps: int
    threads: tuple[int, ...]
    processes: int
    functions: bool
    max_seconds: float
    seed: int
    extra: dict[str, Any] = field(default_factory=dict)


# -- set-up -------------------------------------------------------------------------------------

REFERENCE_ENV = "REDISLUA_BENCH_REFERENCE"


def setup_django(url: str, functions: bool) -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_redislua"],
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}},
        REDISLUA={"CONNECTION": url, "SOCKET_TIMEOUT": 5, "USE_FUNCTIONS": functions,
                  # The peers record no metrics: like with like (docs/observability.md).
                  "METRICS": [],
                  # --reference: redis-py's pooled connections per call (lean transport off);
                  # an environment variable, so the throughput worker processes follow it.
                  "LEAN_CALLS": os.environ.get(REFERENCE_ENV) != "1"},
        RATELIMIT_USE_CACHE="default",
        SECRET_KEY="bench",
        USE_TZ=True,
    )
    django.setup()


def check_loopback(url: str, doing: str = "floods it") -> None:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme != "unix" and host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"refusing a non-loopback Redis ({host!r}): this benchmark {doing}")


def min_args(algorithm_code: str = "fw") -> list[Any]:
    """Our single-policy ARGV shape: mode, now, code, limit, param, cost, extra, gate."""
    return ["hit", "", algorithm_code, QUOTA, HOUR_US, 1, "", "1"]


def minimal_script(client: Any, functions: bool) -> Call:
    """The minimal TIME + GET + SET PX script, through our transport (the lean one where it
    applies), shaped like ours: the same ARGV, and a state key of the same shape as a policy's
    (a longer key costs the server about 1.5% more per call)."""
    from django_redislua.conf import settings

    send = transport_send()
    args = min_args()
    prefix = f"{settings.KEY_PREFIX}:minimal:fw:"
    if functions:
        client.function_load(
            f"#!lua name={MIN_LIBRARY}\nredis.register_function('{MIN_LIBRARY}', "
            f"function(KEYS, ARGV)\n{MIN_BODY}\nend)", replace=True)
        head: tuple[Any, ...] = ("FCALL", MIN_LIBRARY, 1)
    else:
        head = ("EVALSHA", client.script_load(MIN_BODY), 1)
    return lambda key: send(*head, f"{prefix}{{{key}}}", *args)


def transport_send() -> Callable[..., Any]:
    """``send(*command)``: one command through the app's sync transport, sent once."""
    from django_redislua.transport import get_transport

    transport = get_transport()
    return lambda *command: transport.reply(command)  # type: ignore[attr-defined]


def baselines(client: Any, functions: bool) -> list[Contender]:
    conn = client.connection_pool.make_connection()  # dedicated: no pool, no retry, no checks
    conn.connect()

    def lean_floor(key: str) -> Any:
        conn.send_command("INCR", key)
        return conn.read_response()

    send = transport_send()
    found = [
        Contender("redis-py INCR", "baseline", "INCR", client.incr),
        Contender("lean floor INCR", "baseline", "INCR", lean_floor),
        Contender("lean channel INCR", "baseline", "INCR", lambda key: send("INCR", key)),
    ]
    found.append(Contender("min TIME+GET+SET PX", "baseline", "script",
                           minimal_script(client, functions)))
    return found


def ours(rate: str, tag: str, algorithms: Sequence[str] = OURS) -> list[Contender]:
    from django_redislua import Policy

    found = []
    for algorithm in algorithms:
        if algorithm == "concurrency":
            count = int(rate.split("/")[0])
            policy = Policy(f"{tag}_cc", algorithm="concurrency", limit=count, timeout="1h")
        else:
            policy = Policy(f"{tag}_{algorithm}", rate=rate, algorithm=algorithm)
        found.append(Contender(f"ours {algorithm}", "ours", algorithm, policy.hit))
    return found


def limits_peers(url: str, count: int) -> list[Contender]:
    from limits import parse, storage, strategies

    store = storage.RedisStorage(url)
    quota = parse(f"{count}/hour")
    found = []
    for name, algorithm, strategy in (
        ("moving window", "sliding_log", strategies.MovingWindowRateLimiter),
        ("fixed window", "fixed_window", strategies.FixedWindowRateLimiter),
        ("sliding counter", "sliding_window", strategies.SlidingWindowCounterRateLimiter),
    ):
        limiter = strategy(store)
        found.append(Contender(f"limits {name}", "limits", algorithm,
                               lambda key, lim=limiter: lim.hit(quota, key)))
    return found


def throttled_peers(url: str, count: int) -> list[Contender]:
    from throttled import RedisStore, Throttled, per_hour

    store = RedisStore(server=url)
    found = []
    for algorithm, using in (
        ("fixed_window", "fixed_window"),
        ("sliding_window", "sliding_window"),
        ("token_bucket", "token_bucket"),
        ("leaky_bucket", "leaking_bucket"),
        ("gcra", "gcra"),
    ):
        throttle = Throttled(using=using, quota=per_hour(count), store=store)
        found.append(Contender(f"throttled-py {using}", "throttled-py", algorithm,
                               lambda key, t=throttle: t.limit(key)))
    return found


def django_peers(count: int, tag: str) -> list[Contender]:
    from django.contrib.auth.models import AnonymousUser
    from django.core.cache import caches
    from django.test import RequestFactory
    from django_ratelimit.core import is_ratelimited
    from rest_framework.throttling import UserRateThrottle

    factory = RequestFactory()

    def requests() -> Callable[[str], Any]:
        # One request per key, built outside the timed call after its first use: only the
        # limiter's own work is measured (keys are few: they change every --rotate samples).
        made: dict[str, Any] = {}

        def request_for(key: str) -> Any:
            request = made.get(key)
            if request is None:
                if len(made) > 64:
                    made.clear()
                request = made[key] = factory.get("/", REMOTE_ADDR=key)
                request.user = AnonymousUser()
            return request

        return request_for

    ratelimit_request, drf_request = requests(), requests()

    def remote_addr(group: str, request: Any) -> str:
        return str(request.META["REMOTE_ADDR"])

    def django_ratelimit_hit(key: str) -> bool:
        return is_ratelimited(ratelimit_request(key), group=f"bench_{tag}", key=remote_addr,
                              rate=f"{count}/h", increment=True)

    class Throttle(UserRateThrottle):
        cache = caches["default"]
        rate = f"{count}/hour"
        scope = f"bench_{tag}"

    throttle = Throttle()

    def drf_hit(key: str) -> bool:
        return throttle.allow_request(drf_request(key), None)  # type: ignore[arg-type]

    return [
        Contender("django-ratelimit", "django-ratelimit", "fixed_window", django_ratelimit_hit),
        Contender("DRF UserRateThrottle", "DRF", "sliding_log", drf_hit),
    ]


def peers(url: str, count: int, tag: str) -> list[Contender]:
    return limits_peers(url, count) + throttled_peers(url, count) + django_peers(count, tag)


# -- timing ---------------------------------------------------------------------------------------

@dataclass
class Samples:
    latencies: list[list[int]]  # ns, per contender, in sample order
    local: list[int]  # answers with Decision.local, per contender
    taken: int


def sample(found: Sequence[Contender], samples: int, keys_for: Callable[[int], list[str]],
           rotate: int, deadline: float, rng: random.Random) -> Samples:
    """``samples`` times, call every contender once in a shuffled order, each call timed alone.
    ``keys_for(block)`` gives the contenders' keys, changed every ``rotate`` samples."""
    latencies: list[list[int]] = [[] for _ in found]
    local = [0] * len(found)
    order = list(range(len(found)))
    calls = [c.call for c in found]
    clock = time.perf_counter_ns
    keys: list[str] = []
    taken = 0
    gc.disable()  # collections happen between blocks, not inside a timed call
    try:
        for n in range(samples):
            if n % CHECK_EVERY == 0:
                if n and time.monotonic() > deadline:
                    break
                gc.collect()
            if n % rotate == 0:
                keys = keys_for(n // rotate)
            rng.shuffle(order)
            for i in order:
                call, key = calls[i], keys[i]
                start = clock()
                result = call(key)
                latencies[i].append(clock() - start)
                if getattr(result, "local", False):
                    local[i] += 1
            taken += 1
    finally:
        gc.enable()
    return Samples(latencies, local, taken)


def block_ratios(values: list[int], base: list[int], blocks: int = 10) -> list[float]:
    """The ratio of medians in each of ``blocks`` consecutive slices of the run."""
    size = max(1, len(values) // blocks)
    out = []
    for start in range(0, len(values) - size + 1, size):
        out.append(statistics.median(values[start:start + size])
                   / statistics.median(base[start:start + size]))
    return out


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0], values[0]) if values else (float("nan"), float("nan"))
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def summarize(found: Sequence[Contender], got: Samples, base: int = 0) -> list[dict[str, Any]]:
    base_median = statistics.median(got.latencies[base])
    base_mean = statistics.fmean(got.latencies[base])
    rows = []
    for c, values, local in zip(found, got.latencies, got.local, strict=True):
        median = statistics.median(values)
        low, high = quartiles(block_ratios(values, got.latencies[base]))
        rows.append({
            "label": c.label, "who": c.who, "algorithm": c.algorithm, "samples": len(values),
            "median_us": median / 1000, "mean_us": statistics.fmean(values) / 1000,
            "x_incr": median / base_median, "x_incr_q1": low, "x_incr_q3": high,
            "mean_x_incr": statistics.fmean(values) / base_mean,
            "local": local, "local_share": local / len(values) if values else 0.0,
        })
    return rows


def best_peers(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per algorithm, the fastest peer row (lowest median)."""
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["who"] in ("ours", "baseline"):
            continue
        current = best.get(row["algorithm"])
        if current is None or row["median_us"] < current["median_us"]:
            best[row["algorithm"]] = row
    return best


def warm(found: Sequence[Contender], tag: str, calls: int = 20) -> None:
    for i, c in enumerate(found):  # connections, script loads, imports
        for n in range(calls):
            c.call(f"warm:{tag}:{i}:{n}")


# -- sections -----------------------------------------------------------------------------------

def allowed_path(url: str, client: Any, s: Settings, deadline: float,
                 rng: random.Random) -> dict[str, Any]:
    found = baselines(client, s.functions) + ours(f"{QUOTA}/h", "allow") + peers(
        url, QUOTA, "allow")
    warm(found, "allowed")
    run = rng.randrange(1 << 30)

    def keys_for(block: int) -> list[str]:
        return [f"bench:a:{run}:{block}:{i}" for i in range(len(found))]

    got = sample(found, s.samples, keys_for, s.rotate, deadline, rng)
    rows = summarize(found, got)
    by_label = {row["label"]: row for row in rows}
    minimal = by_label["min TIME+GET+SET PX"]["median_us"]
    best = best_peers(rows)
    for row in rows:
        row["x_min_script"] = row["median_us"] / minimal
        peer = best.get(row["algorithm"])
        if row["who"] == "ours" and peer is not None:
            row["best_peer"] = peer["label"]
            row["x_best_peer"] = row["median_us"] / peer["median_us"]
    return {"samples": got.taken, "rows": rows}


def denied_path(url: str, client: Any, s: Settings, deadline: float,
                rng: random.Random) -> dict[str, Any]:
    found = [Contender("redis-py INCR", "baseline", "INCR", client.incr)]
    found += ours("1/h", "deny") + peers(url, 1, "deny")
    run = rng.randrange(1 << 30)
    keys = [f"bench:d:{run}:{i}" for i in range(len(found))]
    keys[0] = f"bench:d:{run}:incr"
    for c, key in zip(found[1:], keys[1:], strict=True):  # exhaust every limiter first
        for _ in range(3):
            c.call(key)
    got = sample(found, s.denied_samples, lambda block: keys, s.denied_samples + 1, deadline,
                 rng)
    rows = summarize(found, got)
    best = best_peers(rows)
    for row in rows:
        peer = best.get(row["algorithm"])
        if row["who"] == "ours" and peer is not None:
            row["best_peer"] = peer["label"]
            row["x_best_peer"] = row["median_us"] / peer["median_us"]
    # Sanity: nothing of ours was admitted during the flood.
    admitted = {c.label: sum(bool(c.call(k)) for _ in range(3))
                for c, k in zip(found, keys, strict=True) if c.who == "ours"}
    return {"samples": got.taken, "rows": rows, "admitted_after": admitted}


def race(s: Settings, deadline: float, rng: random.Random) -> list[dict[str, Any]]:
    from django_redislua import Policy

    run = rng.randrange(1 << 30)
    out = []
    for trial in range(s.race_trials):
        for algorithm in s.race_algorithms:
            if time.monotonic() > deadline and trial:
                break
            policy = Policy(f"race_{algorithm}", rate=RACE_RATE, algorithm=algorithm)
            identity = f"race:{run}:{trial}"
            barrier = threading.Barrier(s.race_threads)
            admitted = [0] * s.race_threads
            local = [0] * s.race_threads
            errors: list[BaseException] = []

            def worker(i: int, policy: Any = policy, identity: str = identity,
                       barrier: threading.Barrier = barrier, admitted: list[int] = admitted,
                       local: list[int] = local, errors: list[BaseException] = errors) -> None:
                try:
                    barrier.wait(timeout=60)
                    for _ in range(s.race_calls):
                        decision = policy.hit(identity)
                        admitted[i] += decision.allowed
                        local[i] += decision.local
                except BaseException as exc:  # reported, not raised: the run goes on
                    errors.append(exc)

            threads = [threading.Thread(target=worker, args=(i,), daemon=True)
                       for i in range(s.race_threads)]
            start = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
            elapsed = time.perf_counter() - start
            out.append({
                "algorithm": algorithm, "trial": trial, "threads": s.race_threads,
                "calls": s.race_threads * s.race_calls, "admitted": sum(admitted),
                "local": sum(local), "seconds": elapsed, "errors": [repr(e) for e in errors[:3]],
                "stuck": sum(thread.is_alive() for thread in threads),
            })
    return out


def server_time(client: Any, s: Settings, deadline: float,
                rng: random.Random) -> dict[str, Any]:
    import redis

    found = [Contender("min TIME+GET+SET PX", "baseline", "script",
                       minimal_script(client, s.functions))]
    found += ours(f"{QUOTA}/h", "server")
    warm(found, "server")
    admin = redis.Redis(connection_pool=redis.ConnectionPool(
        **client.connection_pool.connection_kwargs))
    stat = "cmdstat_fcall" if s.functions else "cmdstat_evalsha"
    usec: list[list[float]] = [[] for _ in found]
    ratios: list[list[float]] = [[] for _ in found]
    mismatched: list[str] = []
    order = list(range(len(found)))
    run = rng.randrange(1 << 30)
    rounds = 0
    for round_no in range(s.server_rounds):
        if round_no and time.monotonic() > deadline:
            break
        rng.shuffle(order)
        this: dict[int, float] = {}
        for i in order:
            call, key = found[i].call, f"bench:s:{run}:{round_no}:{i}"
            admin.config_resetstat()
            for _ in range(s.server_batch):
                call(key)
            entry = admin.info("commandstats").get(stat, {})
            calls = int(entry.get("calls", 0))
            if calls != s.server_batch:
                mismatched.append(f"{found[i].label}: {calls} calls of {s.server_batch}")
            this[i] = float(entry.get("usec", 0)) / max(1, calls)
        for i, value in this.items():
            usec[i].append(value)
            ratios[i].append(value / this[0])
        rounds += 1
    admin.close()
    rows = []
    for c, values, rs in zip(found, usec, ratios, strict=True):
        low, high = quartiles(rs)
        rows.append({"label": c.label, "who": c.who, "algorithm": c.algorithm,
                     "usec_per_call": statistics.median(values),
                     "x_min_script": statistics.median(rs), "x_min_q1": low, "x_min_q3": high})
    return {"stat": stat, "rounds": rounds, "batch": s.server_batch, "rows": rows,
            "mismatched": mismatched[:5]}


def throughput_calls(client: Any) -> dict[str, Call]:
    from django_redislua import Policy

    calls: dict[str, Call] = {"INCR": client.incr}
    for algorithm in THROUGHPUT[1:]:
        calls[algorithm] = Policy(f"tp_{algorithm}", rate=f"{QUOTA}/h", algorithm=algorithm).hit
    return calls


def identities(tag: str) -> list[str]:
    return [f"tp:{tag}:{n}" for n in range(IDENTITIES)]


def run_for(call: Call, names: list[str], seconds: float) -> int:
    """Call until ``seconds`` have passed; return how many calls were made."""
    clock = time.perf_counter
    end = clock() + seconds
    n = 0
    while clock() < end:
        call(names[n % IDENTITIES])
        n += 1
    return n


def thread_rate(call: Call, threads: int, seconds: float, tag: str) -> float:
    counts = [0] * threads
    barrier = threading.Barrier(threads + 1)
    names = [identities(f"{tag}:{i}") for i in range(threads)]

    def worker(i: int) -> None:
        barrier.wait(timeout=60)
        counts[i] = run_for(call, names[i], seconds)

    pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for thread in pool:
        thread.start()
    barrier.wait(timeout=60)
    start = time.perf_counter()
    for thread in pool:
        thread.join(seconds + 60)
    return sum(counts) / (time.perf_counter() - start)


def process_worker(url: str, functions: bool, tasks: Any, results: Any, barrier: Any) -> None:
    """A throughput worker process: its own Django set-up and client; runs tasks until None."""
    setup_django(url, functions)
    from django_redislua.connection import get_client

    calls = throughput_calls(get_client())
    for name, call in calls.items():
        for n in range(20):
            call(f"warm:proc:{os.getpid()}:{name}:{n}")
    results.put(("ready", os.getpid()))
    while True:
        task = tasks.get()
        if task is None:
            return
        name, seconds, tag = task
        names = identities(f"{tag}:{os.getpid()}")
        barrier.wait(timeout=120)
        start = time.perf_counter()
        count = run_for(calls[name], names, seconds)
        results.put((name, count / (time.perf_counter() - start)))


class Workers:
    """``count`` spawned worker processes fed one measurement at a time."""

    def __init__(self, url: str, functions: bool, count: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.count = count
        self.tasks, self.results = ctx.Queue(), ctx.Queue()
        barrier = ctx.Barrier(count)
        self.procs = [ctx.Process(target=process_worker, daemon=True,
                                  args=(url, functions, self.tasks, self.results, barrier))
                      for _ in range(count)]
        for proc in self.procs:
            proc.start()
        for _ in range(count):
            self.results.get(timeout=120)

    def rate(self, name: str, seconds: float, tag: str) -> float:
        for _ in range(self.count):
            self.tasks.put((name, seconds, tag))
        return sum(self.results.get(timeout=seconds + 120)[1] for _ in range(self.count))

    def close(self) -> None:
        for _ in self.procs:
            self.tasks.put(None)
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)


def throughput(url: str, client: Any, s: Settings, deadline: float,
               rng: random.Random) -> dict[str, Any]:
    calls = throughput_calls(client)
    for name, call in calls.items():
        for n in range(20):
            call(f"warm:tp:{name}:{n}")
    modes = [f"{n} thread{'s' if n > 1 else ''}" for n in s.threads]
    workers = Workers(url, s.functions, s.processes) if s.processes else None
    if workers is not None:
        modes.append(f"{s.processes} processes")
    rates: dict[str, dict[str, list[float]]] = {name: {m: [] for m in modes} for name in calls}
    run = rng.randrange(1 << 30)
    reps = 0
    try:
        for rep in range(s.reps):
            if rep and time.monotonic() > deadline:
                break
            plan = [(name, mode) for name in calls for mode in modes]
            rng.shuffle(plan)
            for name, mode in plan:
                tag = f"{run}:{rep}:{name}:{mode.replace(' ', '')}"
                if mode.endswith("processes"):
                    assert workers is not None
                    value = workers.rate(name, s.seconds, tag)
                else:
                    value = thread_rate(calls[name], int(mode.split()[0]), s.seconds, tag)
                rates[name][mode].append(value)
            reps += 1
    finally:
        if workers is not None:
            workers.close()
    table = {name: {mode: statistics.median(values) for mode, values in per.items() if values}
             for name, per in rates.items()}
    # Per repetition, each figure over INCR's in the same repetition and mode; then the median.
    ratios = {name: {mode: statistics.median(v / b for v, b in zip(values, rates["INCR"][mode],
                                                                   strict=True))
                     for mode, values in per.items() if values}
              for name, per in rates.items() if name != "INCR"}
    return {"reps": reps, "seconds": s.seconds, "modes": modes, "per_second": table,
            "x_incr": ratios, "runs": rates}


# -- report -------------------------------------------------------------------------------------

def header(url: str, client: Any, s: Settings) -> dict[str, Any]:
    import redis

    try:
        import hiredis  # type: ignore[import-not-found]

        hiredis_version = hiredis.__version__
    except ImportError:
        hiredis_version = "no"
    info = client.info("server")
    from django_redislua.transport import get_transport

    return {
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs",
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "redis_py": redis.__version__,
        "hiredis": hiredis_version if redis.utils.HIREDIS_AVAILABLE else f"{hiredis_version} "
                   "(unused)",
        "server": f"{'valkey' if 'valkey_version' in info else 'redis'} "
                  f"{info.get('valkey_version', info['redis_version'])}",
        "url": url,
        "mode": "FCALL (USE_FUNCTIONS)" if s.functions else "EVALSHA",
        "transport": type(get_transport().source).__name__,  # type: ignore[attr-defined]
        "settings": {k: v for k, v in vars(s).items() if k != "extra"},
    }


def verdict(ok: bool) -> str:
    return "OK" if ok else "FAIL"


def acceptance(report: dict[str, Any]) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []

    def add(what: str, value: float, op: str, threshold: float) -> None:
        ok = value <= threshold if op == "<=" else value == threshold
        lines.append({"criterion": what, "value": value, "op": op, "threshold": threshold,
                      "ok": ok})

    allowed = {r["algorithm"]: r for r in report["allowed"]["rows"] if r["who"] == "ours"}
    for algorithm in RATE_ALGORITHMS:
        add(f"allowed {algorithm} x INCR", allowed[algorithm]["x_incr"], "<=",
            ALLOWED_MAX[algorithm])
    for algorithm in RATE_ALGORITHMS:
        row = allowed[algorithm]
        add(f"allowed {algorithm} x best peer ({row['best_peer']})", row["x_best_peer"], "<=",
            PEER_MAX)
    denied = {r["algorithm"]: r for r in report["denied"]["rows"] if r["who"] == "ours"}
    for algorithm in RATE_ALGORITHMS:
        add(f"denied flood {algorithm} x INCR (median)", denied[algorithm]["x_incr"], "<=",
            DENIED_MAX)
    for algorithm in sorted({r["algorithm"] for r in report["race"]}):
        trials = [r for r in report["race"] if r["algorithm"] == algorithm]
        worst = max(trials, key=lambda r: abs(r["admitted"] - RACE_LIMIT))
        add(f"race {trials[0]['threads']} threads {algorithm}: admitted (worst of "
            f"{len(trials)})", worst["admitted"], "==", RACE_LIMIT)
    server = {r["algorithm"]: r for r in report["server"]["rows"] if r["who"] == "ours"}
    for algorithm in RATE_ALGORITHMS:
        add(f"server us {algorithm} x min script", server[algorithm]["x_min_script"], "<=",
            SERVER_MAX)
    # Issue 38: a calendar quota's allowed path costs no more than a fixed window's.
    add("allowed calendar x fixed_window", allowed["calendar"]["x_incr"]
        / allowed["fixed_window"]["x_incr"], "<=", CALENDAR_MAX)
    add("denied flood calendar x INCR (median)", denied["calendar"]["x_incr"], "<=", DENIED_MAX)
    add("server us calendar x min script", server["calendar"]["x_min_script"], "<=", SERVER_MAX)
    return lines


def print_report(report: dict[str, Any]) -> None:
    h = report["header"]
    print(f"# {h['machine']}, load {h['load_average']}, Python {h['python']}, "
          f"redis-py {h['redis_py']}, hiredis {h['hiredis']}, {h['server']} at {h['url']}, "
          f"{h['mode']}")
    st = h["settings"]
    print(f"# samples {st['samples']} (keys rotated every {st['rotate']}), denied samples "
          f"{st['denied_samples']}, race {st['race_threads']} threads x {st['race_calls']} calls"
          f" x {st['race_trials']} trials, server {st['server_rounds']} rounds x "
          f"{st['server_batch']} calls, throughput {st['seconds']} s x {st['reps']} reps, "
          f"threads {st['threads']}, {st['processes']} processes, seed {st['seed']}, "
          f"max {st['max_seconds']} s")

    allowed = report["allowed"]
    print(f"\n## 1. Allowed path, per call ({allowed['samples']} interleaved samples; "
          "x INCR = median / INCR median, [q1-q3] over 10 blocks)")
    print(f"{'contender':<28} {'algorithm':<15} {'median us':>9} {'x INCR':>7} "
          f"{'[q1 - q3]':>15} {'x min':>6} {'x best peer':>12}  best peer")
    order = {"baseline": 0, "ours": 1}
    rows = sorted(allowed["rows"], key=lambda r: (order.get(r["who"], 2),
                                                   r["algorithm"] if r["who"] != "baseline"
                                                   else "", r["median_us"]))
    for r in rows:
        peer = (f"{r['x_best_peer']:>12.3f}  {r['best_peer']}" if "x_best_peer" in r
                else f"{'':>12}")
        print(f"{r['label']:<28} {r['algorithm']:<15} {r['median_us']:>9.1f} "
              f"{r['x_incr']:>7.3f} [{r['x_incr_q1']:.3f}-{r['x_incr_q3']:.3f}] "
              f"{r['x_min_script']:>6.3f} {peer}")

    denied = report["denied"]
    print(f"\n## 2. Denied path: a flood from one identity, 1/h exhausted "
          f"({denied['samples']} interleaved samples)")
    print(f"{'contender':<28} {'algorithm':<15} {'median us':>9} {'x INCR':>7} "
          f"{'[q1 - q3]':>15} {'mean us':>8} {'mean x':>7} {'local':>7} {'x best peer':>12}")
    rows = sorted(denied["rows"], key=lambda r: (order.get(r["who"], 2), r["algorithm"],
                                                  r["median_us"]))
    for r in rows:
        local = f"{r['local_share']:>7.1%}" if r["who"] == "ours" else f"{'':>7}"
        peer = f"{r['x_best_peer']:>12.3f}" if "x_best_peer" in r else ""
        print(f"{r['label']:<28} {r['algorithm']:<15} {r['median_us']:>9.1f} "
              f"{r['x_incr']:>7.3f} [{r['x_incr_q1']:.3f}-{r['x_incr_q3']:.3f}] "
              f"{r['mean_us']:>8.1f} {r['mean_x_incr']:>7.3f} {local} {peer}")
    print(f"admitted by ours after the flood (3 more calls each): {denied['admitted_after']}")

    print(f"\n## 3. Race: threads behind a barrier on one identity of a {RACE_RATE} policy")
    print(f"{'algorithm':<15} {'trial':>5} {'threads':>7} {'calls':>6} {'admitted':>8} "
          f"{'local':>6} {'seconds':>7}")
    for r in report["race"]:
        mark = "OK" if r["admitted"] == RACE_LIMIT else "FAIL"
        extra = f"  errors {r['errors']}" if r["errors"] else ""
        extra += f"  stuck {r['stuck']}" if r["stuck"] else ""
        print(f"{r['algorithm']:<15} {r['trial']:>5} {r['threads']:>7} {r['calls']:>6} "
              f"{r['admitted']:>8} {r['local']:>6} {r['seconds']:>7.3f}  {mark}{extra}")

    server = report["server"]
    print(f"\n## 4. Server time per decision ({server['stat']}, median of {server['rounds']} "
          f"rounds x {server['batch']} calls)")
    print(f"{'contender':<28} {'usec/call':>9} {'x min':>7} {'[q1 - q3]':>15}")
    for r in server["rows"]:
        print(f"{r['label']:<28} {r['usec_per_call']:>9.2f} {r['x_min_script']:>7.3f} "
              f"[{r['x_min_q1']:.3f}-{r['x_min_q3']:.3f}]")
    if server["mismatched"]:
        print(f"(call counts off: {server['mismatched']})")

    tp = report["throughput"]
    print(f"\n## 5. Throughput, allowed path, decisions/s (median of {tp['reps']} x "
          f"{tp['seconds']} s)")
    print(f"{'contender':<20}" + "".join(f"{m:>14}" for m in tp["modes"]))
    for name, per in tp["per_second"].items():
        print(f"{name:<20}" + "".join(f"{per.get(m, float('nan')):>14.0f}" for m in tp["modes"]))
    for name, per in tp["x_incr"].items():
        print(f"{name + ' x INCR':<20}" + "".join(
            f"{per[m]:>14.3f}" if m in per else f"{'':>14}" for m in tp["modes"]))
    print("(x INCR: median over repetitions of the ratio within one repetition)")

    print("\n## Acceptance (issue #13)")
    for line in report["acceptance"]:
        value = line["value"]
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        print(f"{verdict(line['ok']):<4} {line['criterion']:<66} {shown:>7} {line['op']} "
              f"{line['threshold']}")
    passed = sum(line["ok"] for line in report["acceptance"])
    print(f"{passed} of {len(report['acceptance'])} OK; run took {report['seconds']:.0f} s")


# -- chart --------------------------------------------------------------------------------------

def chart(report: dict[str, Any], path: Path) -> None:
    """Two panels of ratios to a bare INCR, per algorithm: ours next to the best peer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = report["header"]
    algorithms = list(RATE_ALGORITHMS)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 10), dpi=100)
    ours_color, peer_color = "#c0392b", "#95a5a6"

    def panel(ax: Any, section: dict[str, Any], title: str,
              lines: list[tuple[float, str, str, str]], log: bool) -> None:
        mine = {r["algorithm"]: r for r in section["rows"] if r["who"] == "ours"}
        best = best_peers(section["rows"])
        shown = [mine[a]["x_incr"] for a in algorithms]
        shown += [best[a]["x_incr"] for a in algorithms if a in best]
        ys = list(range(len(algorithms)))[::-1]
        height = 0.4
        for y, algorithm in zip(ys, algorithms, strict=True):
            value = mine[algorithm]["x_incr"]
            ax.barh(y + height / 2, value, height, color=ours_color,
                    label="django-redislua" if y == ys[0] else None)
            ax.text(value, y + height / 2, f" {value:.2f}", va="center", fontsize=9,
                    fontweight="bold")
            peer = best.get(algorithm)
            if peer is not None:
                ax.barh(y - height / 2, peer["x_incr"], height, color=peer_color,
                        label="best peer on the same algorithm" if y == ys[0] else None)
                ax.text(peer["x_incr"], y - height / 2, f" {peer['x_incr']:.2f}  {peer['label']}",
                        va="center", fontsize=8.5, color="#333333")
        for x, style, color, label in lines:
            ax.axvline(x, color=color, linestyle=style, linewidth=1.2, label=label)
        ax.set_yticks(ys)
        ax.set_yticklabels(algorithms, fontsize=10)
        if log:
            ax.set_xscale("log")
            low, high = min(shown) / 1.6, max(shown) * 4.5
            ax.set_xlim(low, high)
            ax.set_xticks([t for t in (0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16)
                           if low <= t <= high])
            ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        else:
            ax.set_xlim(0, max(shown) * 1.45)
        ax.set_ylim(-0.7, len(algorithms) - 0.3)
        ax.set_xlabel("median latency per call / median of a bare redis-py INCR "
                      "(lower is better)", fontsize=9.5)
        ax.set_title(title, fontsize=11, loc="left")
        ax.grid(axis="x", alpha=0.3)
        entries = len(lines) + 2
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17),
                  ncol=entries if entries <= 4 else 3, fontsize=8.5, frameon=False)

    allowed = report["allowed"]
    by_label = {r["label"]: r for r in allowed["rows"]}
    references = [(1.0, "-", "black", "bare redis-py INCR = 1")]
    floor = by_label.get("lean floor INCR")
    if floor is not None:
        references.append((floor["x_incr"], ":", "#2c3e50",
                           f"lean floor INCR ({floor['x_incr']:.2f})"))
    minimal = by_label["min TIME+GET+SET PX"]
    references.append((minimal["x_incr"], "--", "#2c3e50",
                       f"minimal TIME+GET+SET PX script ({minimal['x_incr']:.2f})"))
    panel(top, allowed,
          f"Allowed path: quota never reached, {allowed['samples']} interleaved calls each",
          references, log=False)
    denied = report["denied"]
    panel(bottom, denied,
          f"Denied path: a flood from one identity, 1/h exhausted, {denied['samples']} "
          "interleaved calls each (log scale)",
          [(1.0, "-", "black", "bare redis-py INCR = 1"),
           (DENIED_MAX, "--", ours_color, f"goal: {DENIED_MAX}x INCR")],
          log=True)
    machine = h["machine"].split(" ", 1)[1]
    fig.suptitle(f"django-redislua rate limits against peers ({h['mode']}), "
                 f"{time.strftime('%Y-%m-%d')}\n"
                 f"{h['server']}, Python {h['python']}, redis-py {h['redis_py']}, "
                 f"hiredis {h['hiredis']}, {machine}, loopback TCP", fontsize=11)
    fig.subplots_adjust(left=0.13, right=0.97, top=0.9, bottom=0.1, hspace=0.5)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


# -- main ---------------------------------------------------------------------------------------

def settings_from(options: argparse.Namespace) -> Settings:
    quick = options.quick

    def pick(value: Any, full: Any, fast: Any) -> Any:
        return value if value is not None else (fast if quick else full)

    return Settings(
        samples=pick(options.samples, 50_000, 50_000),
        denied_samples=pick(options.denied_samples, 50_000, 50_000),
        rotate=options.rotate,
        race_threads=options.race_threads,
        race_calls=pick(options.race_calls, 20, 10),
        race_trials=pick(options.race_trials, 3, 1),
        race_algorithms=RATE_ALGORITHMS,
        server_rounds=pick(options.server_rounds, 60, 60),
        server_batch=pick(options.server_batch, 1000, 500),
        seconds=pick(options.seconds, 1.0, 0.5),
        reps=pick(options.reps, 6, 1),
        threads=tuple(int(n) for n in options.threads.split(",")),
        processes=options.processes,
        functions=options.functions,
        max_seconds=pick(options.max_seconds, 300.0, 60.0),
        seed=options.seed,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a ~1 minute smoke run")
    parser.add_argument("--functions", action="store_true",
                        help="ours as Redis Functions (REDISLUA USE_FUNCTIONS=True)")
    parser.add_argument("--reference", action="store_true",
                        help="ours on the reference transport (REDISLUA LEAN_CALLS=False)")
    parser.add_argument("--json", type=Path, help="write every figure as JSON here")
    parser.add_argument("--chart", type=Path, default=DEFAULT_CHART)
    parser.add_argument("--no-chart", action="store_true")
    parser.add_argument("--samples", type=int)
    parser.add_argument("--denied-samples", type=int)
    parser.add_argument("--rotate", type=int, default=100, help="samples per key (allowed path)")
    parser.add_argument("--race-threads", type=int, default=64)
    parser.add_argument("--race-calls", type=int)
    parser.add_argument("--race-trials", type=int)
    parser.add_argument("--server-rounds", type=int)
    parser.add_argument("--server-batch", type=int)
    parser.add_argument("--seconds", type=float, help="per throughput measurement")
    parser.add_argument("--reps", type=int, help="throughput repetitions")
    parser.add_argument("--threads", default="1,8,32")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--max-seconds", type=float)
    parser.add_argument("--seed", type=int, default=20240613)
    options = parser.parse_args(argv)
    if options.reference:
        os.environ[REFERENCE_ENV] = "1"
    s = settings_from(options)
    rng = random.Random(s.seed)
    began = time.monotonic()

    with running_server() as url:
        check_loopback(url)
        setup_django(url, s.functions)
        from django_redislua.connection import get_client

        client = get_client()
        report: dict[str, Any] = {"header": header(url, client, s)}
        sections: list[tuple[str, Callable[[float], Any]]] = [
            ("allowed", lambda d: allowed_path(url, client, s, d, rng)),
            ("denied", lambda d: denied_path(url, client, s, d, rng)),
            ("race", lambda d: race(s, d, rng)),
            ("server", lambda d: server_time(client, s, d, rng)),
            ("throughput", lambda d: throughput(url, client, s, d, rng)),
        ]
        for name, run in sections:
            step = time.monotonic()
            print(f"... {name}", file=sys.stderr, flush=True)
            report[name] = run(step + SHARES[name] * s.max_seconds)
            print(f"... {name} took {time.monotonic() - step:.0f} s", file=sys.stderr,
                  flush=True)
    report["acceptance"] = acceptance(report)
    report["seconds"] = time.monotonic() - began
    print_report(report)
    if not options.no_chart:
        chart(report, options.chart)
        print(f"chart: {options.chart}")
    if options.json is not None:
        options.json.write_text(json.dumps(report, indent=1, default=str))
        print(f"json: {options.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
