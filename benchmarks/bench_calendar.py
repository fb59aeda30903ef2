"""What a calendar quota costs beside a fixed window, in one run (issue 38).

    .venv/bin/python benchmarks/bench_calendar.py [--blocks 40] [--samples 500] [--rounds 30]
        [--json PATH] [--seed N]

Starts its own loopback redis-server (django_redislua.testing.running_server), unless REDIS_URL
is set (loopback only). Both policies have a quota no call exhausts (1,000,000 per hour); keys
change every 100 calls, so both write in place (INCRBY) as a real identity mostly does.

1. Allowed path, per call: ``Policy.hit`` of a fixed window and of a calendar quota (the
   project's TIME_ZONE, a day) and a bare redis-py ``INCR``, called in a shuffled order each
   sample, each call timed alone; ``--blocks`` blocks of ``--samples``. Figures: medians over
   all samples, and the calendar / fixed window ratio of each block's medians (median and
   quartiles over blocks: the run's own noise).
2. Server time per call: per round, in a shuffled order, 2,000 pipelined EVALSHA of each
   decision's own command (``CONFIG RESETSTAT`` before, ``cmdstat_evalsha`` after), and a fixed
   window's command carrying a calendar's 43-byte boundaries as its (unused) extra: what the
   argument alone costs. Medians over ``--rounds``.
3. In the app: building a decision's command (``engine._One``, no I/O), interleaved, medians of
   30 timings of 20,000.

Criterion: the allowed path's calendar / fixed window ratio (median over blocks) at most 1.01,
which is less than the blocks' own spread; the ratio of whole-run medians is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_ratelimit import check_loopback, setup_django

from django_redislua.testing import running_server

RATE = "1000000/h"
ROTATE = 100
CRITERION = 1.01


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4)
    return q1, median, q3


def allowed_path(policies: dict[str, Any], incr: Any, blocks: int, samples: int,
                 rng: random.Random) -> dict[str, Any]:
    calls = {**{name: policy.hit for name, policy in policies.items()}, "INCR": incr}
    every: dict[str, list[int]] = {name: [] for name in calls}
    ratios = []
    for block in range(blocks):
        timed: dict[str, list[int]] = {name: [] for name in calls}
        for i in range(samples):
            identity = f"b{block}i{i // ROTATE}"
            order = list(calls.items())
            rng.shuffle(order)
            for name, call in order:
                started = time.perf_counter_ns()
                call(identity)
                timed[name].append(time.perf_counter_ns() - started)
        calendar, fixed = timed["calendar"], timed["fixed_window"]
        ratios.append(statistics.median(calendar) / statistics.median(fixed))
        for name in calls:
            every[name] += timed[name]
    medians = {name: statistics.median(values) / 1000 for name, values in every.items()}
    return {"median_us": medians, "blocks": quartiles(ratios),
            "whole_run": medians["calendar"] / medians["fixed_window"]}


def server_time(policies: dict[str, Any], client: Any, rounds: int,
                rng: random.Random) -> dict[str, float]:
    from django_redislua.limiting import engine

    def commands(name: str, round_: int) -> list[tuple[Any, ...]]:
        policy = policies["fixed_window" if name == "fixed_window + 43 B" else name]
        made = []
        for j in range(2000 // ROTATE):
            identity = f"s{round_}{name}{j}"
            command = engine._One(policy, identity, 1, False, None).command
            if name == "fixed_window + 43 B":
                extra = engine._One(policies["calendar"], identity, 1, False, None).extra
                command = (*command[:-3], extra, *command[-2:])
            made.append(command)
        return made

    per_call: dict[str, list[float]] = {"fixed_window": [], "calendar": [],
                                        "fixed_window + 43 B": []}
    for round_ in range(rounds):
        order = list(per_call)
        rng.shuffle(order)
        for name in order:
            made = commands(name, round_)
            client.config_resetstat()
            pipe = client.pipeline(transaction=False)
            for i in range(2000):
                pipe.execute_command(*made[i // ROTATE])
            pipe.execute()
            per_call[name].append(client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])
    return {name: statistics.median(values) for name, values in per_call.items()}


def in_the_app(policies: dict[str, Any]) -> dict[str, float]:
    from django_redislua.limiting import engine

    timings: dict[str, list[float]] = {name: [] for name in policies}
    for _ in range(30):
        for name, policy in policies.items():
            took = timeit.timeit(lambda p=policy: engine._One(p, "app", 1, False, None),
                                 number=20_000)
            timings[name].append(took / 20_000 * 1e9)
    return {name: statistics.median(values) for name, values in timings.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--seed", type=int, default=20261128)
    options = parser.parse_args(argv)
    rng = random.Random(options.seed)
    with running_server() as url:
        check_loopback(url)
        setup_django(url, False)
        import redis

        from django_redislua import Policy
        from django_redislua.connection import get_client

        client = get_client()
        client.flushall()
        policies = {"fixed_window": Policy("bench_fw", rate=RATE, algorithm="fixed_window"),
                    "calendar": Policy("bench_ca", rate="1000000/day", algorithm="calendar")}
        bare = redis.Redis.from_url(url)
        report = {
            "allowed": allowed_path(policies, bare.incr, options.blocks, options.samples, rng),
            "server_us": server_time(policies, client, options.rounds, rng),
            "app_ns": in_the_app(policies),
        }
    allowed = report["allowed"]
    print(f"## 1. Allowed path ({options.blocks} blocks x {options.samples} samples)")
    for name, us in allowed["median_us"].items():
        print(f"{name:<24} {us:8.1f} us")
    q1, median, q3 = allowed["blocks"]
    print(f"calendar x fixed_window: {median:.4f} [{q1:.4f}-{q3:.4f}] over blocks, "
          f"{allowed['whole_run']:.4f} of whole-run medians")
    print(f"## 2. Server us per call (median of {options.rounds} rounds x 2000 pipelined)")
    for name, us in report["server_us"].items():
        print(f"{name:<24} {us:8.3f}")
    print("## 3. Building a decision's command in the app (ns)")
    for name, ns in report["app_ns"].items():
        print(f"{name:<24} {ns:8.0f}")
    verdict = "OK" if median <= CRITERION else "FAIL"
    print(f"{verdict:<4} allowed calendar x fixed_window (median over blocks) "
          f"{median:.4f} <= {CRITERION}")
    if options.json:
        options.json.write_text(json.dumps(report, indent=2))
    return 0 if verdict == "OK" else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
