"""Redis memory per tracked identity: ours and every peer, per algorithm, in one run.

    .venv/bin/python benchmarks/bench_memory.py [--identities 100000] [--passes 1]
        [--sample 200] [--count 100] [--json PATH] [--only LABEL ...]

Uses REDIS_URL if set (loopback only: the benchmark flushes the database), else starts its own
loopback server (django_redislua.testing.running_server). Every contender limits the same
identities (IPv4 addresses, "10.0.0.1" ...) at the same rate (``--count`` per hour, 100, so ten
hits stay allowed), one contender at a time on an emptied database:

1. **Bytes per identity, after 1 hit and after 10**: ``--sample`` identities are hit once, then
   every key the contender wrote is measured with ``MEMORY USAGE key SAMPLES 0`` (the whole
   value: every member of a set or a log) and the sum divided by the identities; then nine more
   hits each, measured again. Keys a contender keeps for itself rather than per identity
   (none today) would be counted too: the figure is what the database holds, per identity.
2. **100,000 identities**: ``used_memory`` (``INFO memory``) before and after one hit for each of
   ``--identities`` identities, divided by them: what ``MEMORY USAGE`` leaves out is in here
   (the expiry table's entries, the dictionaries' buckets, a value Redis shares rather than
   allocates), and so is the allocator's rounding. A first pass on an emptied database is not
   measured, so that what the server allocates once (a script in its cache, a client's
   buffers) is not counted per identity; then ``--passes`` measured ones, each on an emptied
   database, and their median is the figure. ``used_memory`` moves by 1-10 KB between passes
   for reasons of its own (0.01-0.1 B per identity), so figures within 0.5 B are a tie.

Contenders per algorithm: ours (``Policy.hit``, policy ``api``, the default ``KEY_PREFIX``);
limits (fixed window, sliding window counter, moving window), throttled-py (fixed window,
sliding window, token bucket, leaking bucket, GCRA), django-ratelimit (``is_ratelimited`` over
django-redis: a fixed window) and DRF's ``UserRateThrottle`` over django-redis (a log).
Concurrency has no peer; it is measured with one slot held per identity.

Figures are exact counts, not timings: one run is the figure (the allocator's size classes are
deterministic for a given server build). The report names the server and its allocator.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_ratelimit import (  # noqa: E402  (the rate-limit benchmark's peers, as they are)
    Contender,
    check_loopback,
    limits_peers,
    throttled_peers,
)

from django_redislua.testing import running_server  # noqa: E402

ALGORITHMS = ("fixed_window", "sliding_window", "sliding_log", "token_bucket", "leaky_bucket",
              "gcra", "concurrency")
HITS = (1, 10)
# Bytes per identity below which two figures are the same (the resolution of the used_memory
# delta over 100,000 identities; MEMORY USAGE is exact and ties only when equal).
TIE = 0.5


def identities(count: int) -> Iterator[str]:
    for i in range(1, count + 1):
        yield f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"


def configure(url: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_redislua"],
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}},
        REDISLUA={"CONNECTION": url, "SOCKET_TIMEOUT": 10, "METRICS": []},
        RATELIMIT_USE_CACHE="default",
        SECRET_KEY="bench",
        USE_TZ=True,
    )
    django.setup()


def ours(rate: str) -> list[Contender]:
    from django_redislua import Policy

    found = []
    for algorithm in ALGORITHMS:
        if algorithm == "concurrency":
            # A slot held per identity (what a concurrency policy tracks), as long as a window.
            policy = Policy("api", algorithm="concurrency", limit=100, timeout="1h")
        else:
            policy = Policy("api", rate=rate, algorithm=algorithm)
        found.append(Contender(f"ours {algorithm}", "ours", algorithm, policy.hit))
    return found


def django_peers(count: int) -> list[Contender]:
    from django.contrib.auth.models import AnonymousUser
    from django.core.cache import caches
    from django.test import RequestFactory
    from django_ratelimit.core import is_ratelimited
    from rest_framework.throttling import AnonRateThrottle

    factory = RequestFactory()

    def request_for(key: str) -> Any:
        request = factory.get("/", REMOTE_ADDR=key)
        request.user = AnonymousUser()
        return request

    def remote_addr(group: str, request: Any) -> str:
        return str(request.META["REMOTE_ADDR"])

    def django_ratelimit_hit(key: str) -> bool:
        return is_ratelimited(request_for(key), group="api", key=remote_addr,
                              rate=f"{count}/h", increment=True)

    class Throttle(AnonRateThrottle):  # keyed by the client's address, like the others here
        cache = caches["default"]
        rate = f"{count}/hour"

    throttle = Throttle()

    def drf_hit(key: str) -> bool:
        return throttle.allow_request(request_for(key), None)  # type: ignore[arg-type]

    return [
        Contender("django-ratelimit", "django-ratelimit", "fixed_window", django_ratelimit_hit),
        Contender("DRF AnonRateThrottle", "DRF", "sliding_log", drf_hit),
    ]


def all_contenders(url: str, count: int) -> list[Contender]:
    rate = f"{count}/h"
    found = ours(rate) + limits_peers(url, count) + throttled_peers(url, count)
    found += django_peers(count)
    order = {a: i for i, a in enumerate(ALGORITHMS)}
    return sorted(found, key=lambda c: (order[c.algorithm], c.who != "ours"))


def key_bytes(client: Any) -> tuple[int, int, str]:
    """The sum of MEMORY USAGE over every key, the number of keys, and one key (an example)."""
    total, keys, example = 0, 0, ""
    for key in client.scan_iter(count=1000):
        total += int(client.memory_usage(key, samples=0) or 0)
        keys += 1
        example = example or key.decode("utf-8", "replace")
    return total, keys, example


def used_memory(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def measure(client: Any, contender: Contender, sample: int, many: int,
            passes: int) -> dict[str, Any]:
    row: dict[str, Any] = {"label": contender.label, "who": contender.who,
                           "algorithm": contender.algorithm}
    client.flushall()
    names = list(identities(sample))
    done = 0
    for hits in HITS:
        for _ in range(hits - done):
            for name in names:
                contender.call(name)
        done = hits
        total, keys, example = key_bytes(client)
        row[f"bytes_{hits}"] = total / sample
        row[f"keys_{hits}"] = keys / sample
        row.setdefault("example_key", example)
    if many:
        started = time.monotonic()
        # A first pass the measured ones repeat exactly: what the server allocates once (a
        # script's cache entry, a client's buffers) is there before the measurements start.
        deltas = []
        for measured in range(passes + 1):
            client.flushall()
            before = used_memory(client)
            for name in identities(many):
                contender.call(name)
            if measured:
                deltas.append((used_memory(client) - before) / many)
        row["used_memory_delta"] = statistics.median(deltas)
        row["used_memory_deltas"] = deltas
        row["seconds"] = round(time.monotonic() - started, 1)
    client.flushall()
    return row


def best_peers(rows: list[dict[str, Any]], field: str) -> dict[str, dict[str, Any]]:
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["who"] == "ours" or field not in row:
            continue
        current = best.get(row["algorithm"])
        if current is None or row[field] < current[field]:
            best[row["algorithm"]] = row
    return best


def report(rows: list[dict[str, Any]], header: dict[str, Any]) -> bool:
    print(f"# {header['server']} ({header['allocator']}), redis-py {header['redis_py']}, "
          f"Python {header['python']}; {header['sample']} identities sampled, "
          f"{header['identities']} for used_memory; rate {header['rate']}")
    print(f"{'contender':34} {'1 hit':>8} {'10 hits':>8} {'keys':>5} {'used/id':>8}  example key")
    for row in rows:
        delta = row.get("used_memory_delta")
        print(f"{row['label']:34} {row['bytes_1']:8.1f} {row['bytes_10']:8.1f} "
              f"{row['keys_10']:5.2f} {'' if delta is None else f'{delta:8.1f}':>8}  "
              f"{row['example_key']}")
    ok = True
    print(f"\nours against the best peer per algorithm (ours / best; <= 1.00 is the target; "
          f"used_memory per identity within {TIE} B is a tie: it moves by 1-10 KB between "
          f"passes for reasons of its own)")
    for field, what in (("bytes_1", "after 1 hit"), ("bytes_10", "after 10 hits"),
                        ("used_memory_delta", "used_memory per identity")):
        best = best_peers(rows, field)
        for row in rows:
            peer = best.get(row["algorithm"])
            if row["who"] != "ours" or peer is None or field not in row:
                continue
            ratio = row[field] / peer[field] if peer[field] else float("inf")
            tie = TIE if field == "used_memory_delta" else 0.0
            verdict = ("OK" if row[field] < peer[field] - tie else
                       "OK (tie)" if row[field] <= peer[field] + tie else "FAIL")
            ok = ok and verdict != "FAIL"
            print(f"  {what:25} {row['algorithm']:15} {row[field]:8.1f} vs {peer[field]:8.1f} "
                  f"({peer['label']}) = {ratio:.3f} {verdict}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--identities", type=int, default=100_000,
                        help="identities for the used_memory delta (0: skip it)")
    parser.add_argument("--sample", type=int, default=200,
                        help="identities measured key by key with MEMORY USAGE")
    parser.add_argument("--passes", type=int, default=1,
                        help="measured passes of --identities (their median is the figure)")
    parser.add_argument("--count", type=int, default=100, help="the rate: COUNT per hour")
    parser.add_argument("--only", nargs="*", help="only contenders whose label contains these")
    parser.add_argument("--json", type=Path, help="write every figure as JSON here")
    args = parser.parse_args(argv)
    if not 10 <= args.count <= 1_000_000:
        raise SystemExit("--count must allow the ten hits: 10 <= COUNT <= 1000000")
    if not 1 <= args.sample <= 100_000 or not 0 <= args.identities <= 1_000_000:
        raise SystemExit("--sample must be 1-100000 and --identities 0-1000000")
    if not 1 <= args.passes <= 9:
        raise SystemExit("--passes must be 1-9")

    import redis

    with running_server() as url:
        check_loopback(url, "flushes it")
        configure(url)
        client = redis.Redis.from_url(url)
        info = client.info("server")
        header = {
            "server": f"{'valkey' if 'valkey_version' in info else 'redis'}-server "
                      f"{info.get('valkey_version', info.get('redis_version'))}",
            "allocator": client.info("memory").get("mem_allocator", "?"),
            "redis_py": redis.__version__, "python": platform.python_version(),
            "sample": args.sample, "identities": args.identities, "rate": f"{args.count}/h",
        }
        rows = []
        for contender in all_contenders(url, args.count):
            if args.only and not any(part in contender.label for part in args.only):
                continue
            rows.append(measure(client, contender, args.sample, args.identities,
                                args.passes))
            print(f"  measured {contender.label}", file=sys.stderr, flush=True)
        ok = report(rows, header)
        if args.json:
            args.json.write_text(json.dumps({"header": header, "rows": rows}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
