"""Behind real servers (issue 39): requests/s of a trivial view limited by one policy, as a ratio
to the same view without the limiter, and the limiter's CPU per request in the server.

    .venv/bin/python benchmarks/bench_servers.py [--seconds 2] [--rounds 5] [--json PATH]

The project is benchmarks/server_app.py (no middleware; the policy's quota is never exhausted:
the allowed path). Two servers, each started once, on loopback:

- uvicorn, 1 worker, the async views, ``--clients-async`` (64) concurrent clients;
- gunicorn, 1 worker of 8 threads (gthread), the sync views, ``--clients-sync`` (16) clients.

The load comes from this process: asyncio clients on keep-alive HTTP/1.1 connections, each
sending its next request when the last response is in (the same client work for both views,
so it weighs on both alike; it shares the machine's cores with the server and Redis, as a
load generator on one host does). One round measures, for each server, the bare and the
limited view ``--seconds`` each in a shuffled (seeded) order after a warm-up; the figures are
medians over ``--rounds`` rounds: requests/s, the limited view's ratio to the bare one within
the round, the server's CPU per request (its processes' user+system time, /proc) and its
threads' context switches per request (a thread waiting for the interpreter lock, or for a
socket, is switched out: the cost of threads handing the lock to each other). Any
response but a 200 fails the run. Uses REDIS_URL if set (loopback only), else starts its own
loopback server. Every loop is bounded by count and by time.

Then the request layer's own CPU (issue 39: at most 15 us beyond the engine call), in this
process and one thread: CPU per call of the limited sync view, the bare one, the engine's
``Policy.hit`` on the same identity and a redis-py ``PING``, each ``--calls`` times in a
shuffled order, ``--layer-rounds`` times; medians of each round's figures. Every call builds a
request, whose cost is taken off the engine's and the ``PING``'s; the layer is the limited
view less the bare view less the engine call, also as a multiple of the ``PING``, which
carries from one machine to another.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_ratelimit import check_loopback  # noqa: E402

from django_redislua.testing import free_port  # noqa: E402
from tests.processes import stop_group  # noqa: E402

BOOT_SECONDS = 30.0
TICKS = os.sysconf("SC_CLK_TCK")
LENGTH = re.compile(rb"content-length:\s*(\d+)", re.I)


@dataclass
class Server:
    name: str
    bare: str
    limited: str
    clients: int
    port: int
    command: list[str]


def servers(args: argparse.Namespace) -> list[Server]:
    uvicorn, gunicorn = free_port(), free_port()
    return [
        Server("uvicorn, 1 worker, async view", "/abare/", "/alimited/", args.clients_async,
               uvicorn,
               [sys.executable, "-m", "uvicorn", "--workers", "1", "--host", "127.0.0.1",
                "--port", str(uvicorn), "--no-access-log", "--log-level", "warning",
                "benchmarks.server_app:asgi"]),
        Server("gunicorn, 1 worker x 8 threads, sync view", "/bare/", "/limited/",
               args.clients_sync, gunicorn,
               [sys.executable, "-m", "gunicorn", "--workers", "1", "--threads", "8",
                "--worker-class", "gthread", "--bind", f"127.0.0.1:{gunicorn}",
                "--log-level", "warning", "benchmarks.server_app:wsgi"]),
    ]


def process_usage(pid: int) -> tuple[float, int]:
    """A process's user+system seconds and its threads' context switches (voluntary and not:
    a thread that waits for the interpreter lock or a socket is switched out), its children's
    included (gunicorn's worker)."""
    total, switches = 0.0, 0
    pids = [pid]
    while pids:
        current = pids.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICKS
            for task in Path(f"/proc/{current}/task").iterdir():
                children = (task / "children").read_text().split()
                pids.extend(int(child) for child in children)
                for line in (task / "status").read_text().splitlines():
                    if "ctxt_switches:" in line:  # voluntary_ and nonvoluntary_
                        switches += int(line.split(":")[1])
        except (OSError, ValueError):
            continue
    return total, switches


async def one_client(port: int, path: str, stop_at: float, counts: list[int]) -> None:
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    done = 0
    try:
        while loop.time() < stop_at and done < 10_000_000:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if head[9:12] != b"200":
                raise RuntimeError(f"{path}: {head[:200]!r}")
            length = LENGTH.search(head)
            if length is not None:
                await reader.readexactly(int(length.group(1)))
            else:  # chunked (Django sets no Content-Length; the servers chunk the body)
                while (size := int((await reader.readuntil(b"\r\n"))[:-2], 16)) > 0:
                    await reader.readexactly(size + 2)
                await reader.readuntil(b"\r\n")  # the empty trailer
            done += 1
    finally:
        counts.append(done)
        writer.close()


async def load(port: int, path: str, clients: int, seconds: float) -> int:
    """Requests answered by ``clients`` keep-alive clients in ``seconds``."""
    counts: list[int] = []
    stop_at = asyncio.get_running_loop().time() + seconds
    await asyncio.wait_for(
        asyncio.gather(*(one_client(port, path, stop_at, counts) for _ in range(clients))),
        seconds + 30)
    return sum(counts)


def measure(server: Server, pid: int, path: str, seconds: float
            ) -> tuple[float, float, float]:
    """(requests/s, server CPU us per request, server context switches per request) of
    ``path``."""
    (cpu, switches), started = process_usage(pid), time.perf_counter()
    answered = asyncio.run(load(server.port, path, server.clients, seconds))
    took = time.perf_counter() - started
    cpu_after, switches_after = process_usage(pid)
    answered = max(answered, 1)
    return (answered / took, (cpu_after - cpu) / answered * 1e6,
            (switches_after - switches) / answered)


@contextmanager
def serving(server: Server, redis_url: str) -> Iterator[int]:
    env = {**os.environ, "REDIS_URL": redis_url, "DJANGO_SETTINGS_MODULE":
           "benchmarks.server_app", "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(server.command, cwd=ROOT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + BOOT_SECONDS
        while True:
            try:
                asyncio.run(load(server.port, server.bare, 1, 0.05))
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{server.name} did not start") from None
                time.sleep(0.1)
        yield process.pid
    finally:
        stop_group(process)  # its whole session: gunicorn's worker with its master


def layer_cpu(url: str, calls: int, rounds: int) -> dict[str, float]:
    """CPU us per call, in this process (medians over ``rounds``): the limited view, the bare
    view, the engine call and a redis-py ``PING`` (the last two without the request each call
    makes), and the layer's own: limited view - bare view - engine call, also as a multiple of
    the ``PING`` (machines differ by several times; the ratio travels)."""
    os.environ["REDIS_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.server_app"
    import redis
    from django.test import RequestFactory

    from benchmarks import server_app
    from django_redislua.limiting import get_policy

    factory = RequestFactory()
    policy = get_policy("bench")
    ping = redis.Redis.from_url(url).ping

    def request() -> Any:  # a request is decided once: each call gets its own
        return factory.get("/limited/", REMOTE_ADDR="127.0.0.1")

    ways = {"limited view": lambda: server_app.limited(request()),
            "bare view": lambda: server_app.bare(request()),
            "engine call": lambda: (request(), policy.hit("127.0.0.1")),
            "redis-py PING": lambda: (request(), ping()),
            "request": request}
    for way in ways.values():  # warm-up: the script loaded, the connection open
        for _ in range(min(calls, 200)):
            way()
    # Short stretches of each, in a shuffled order, many times: the machine's speed drifts
    # over seconds, and the layer is a difference of the ways, taken within each stretch.
    order = list(ways)
    shuffle = random.Random(calls)
    rows: list[dict[str, float]] = []
    for _ in range(rounds):
        shuffle.shuffle(order)
        row = {}
        for name in order:
            way = ways[name]
            started = time.process_time()
            for _ in range(calls):
                way()
            row[name] = (time.process_time() - started) / calls * 1e6
        made = row.pop("request")
        row["engine call"] -= made
        row["redis-py PING"] -= made
        row["layer"] = row["limited view"] - row["bare view"] - row["engine call"]
        row["layer x PING"] = row["layer"] / row["redis-py PING"]
        rows.append(row)
    return {name: statistics.median(row[name] for row in rows) for name in rows[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients-async", type=int, default=64)
    parser.add_argument("--clients-sync", type=int, default=16)
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--layer-rounds", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from django_redislua.testing import RedisServer

    own = None
    url = os.environ.get("REDIS_URL")
    if url:
        check_loopback(url)
    else:
        own = RedisServer().start()
        url = own.url
    shuffle = random.Random(args.seed)
    results: dict[str, Any] = {}
    try:
        for server in servers(args):
            with serving(server, url) as pid:
                for path in (server.bare, server.limited):  # warm-up: imports, connections
                    measure(server, pid, path, min(args.seconds, 1.0))
                rounds: list[dict[str, tuple[float, float, float]]] = []
                for _ in range(args.rounds):
                    paths = [server.bare, server.limited]
                    shuffle.shuffle(paths)
                    rounds.append({path: measure(server, pid, path, args.seconds)
                                   for path in paths})
            results[server.name] = {
                "bare_rps": statistics.median(r[server.bare][0] for r in rounds),
                "limited_rps": statistics.median(r[server.limited][0] for r in rounds),
                "ratio": statistics.median(r[server.limited][0] / r[server.bare][0]
                                           for r in rounds),
                "ratios": sorted(r[server.limited][0] / r[server.bare][0] for r in rounds),
                "bare_cpu_us": statistics.median(r[server.bare][1] for r in rounds),
                "limited_cpu_us": statistics.median(r[server.limited][1] for r in rounds),
                "bare_switches": statistics.median(r[server.bare][2] for r in rounds),
                "limited_switches": statistics.median(r[server.limited][2] for r in rounds),
                "clients": server.clients,
            }
        layer = layer_cpu(url, args.calls, args.layer_rounds)
    finally:
        if own is not None:
            own.stop()
    print(f"Python {platform.python_version()}, {args.rounds} rounds of {args.seconds} s "
          "per view; medians")
    print(f"{'server':44} {'bare/s':>8} {'limited/s':>9} {'ratio':>6} [min-max]   "
          f"{'server CPU us/req bare':>22} {'limited':>8}   "
          f"{'context switches/req bare':>25} {'limited':>8}")
    for name, row in results.items():
        print(f"{name:44} {row['bare_rps']:8.0f} {row['limited_rps']:9.0f} "
              f"{row['ratio']:6.2f} [{row['ratios'][0]:.2f}-{row['ratios'][-1]:.2f}] "
              f"{row['bare_cpu_us']:22.0f} {row['limited_cpu_us']:8.0f}   "
              f"{row['bare_switches']:25.1f} {row['limited_switches']:8.1f}")
    print(f"In one process and thread, CPU us per call ({args.layer_rounds} rounds of "
          f"{args.calls} calls, medians): "
          + ", ".join(f"{name} {taken:.2f}" if name.endswith("x PING") else f"{name} {taken:.1f}"
                      for name, taken in layer.items()))
    if args.json:
        args.json.write_text(json.dumps({"servers": results, "cpu_us": layer}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
