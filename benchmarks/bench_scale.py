"""Scale benchmark: decisions/s against one node and against three primaries, in one run.

    .venv/bin/python benchmarks/bench_scale.py [--quick] [--seconds S] [--reps N]
        [--processes 2,4,8] [--algorithms fixed_window,gcra] [--json PATH] [--max-seconds 300]
        [--seed N]

Starts, in the same run, its own loopback servers (django_redislua.testing): one single
redis-server and a Redis Cluster of 3 primaries without replicas. REDIS_URL is not used: the
benchmark needs both topologies, side by side, on the same machine and at the same time.

Clients are spawned processes (``multiprocessing``, spawn), one pool of ``max(--processes)``
per topology, each process configured with ``REDISLUA={"CONNECTION": <url>}`` for its target
(``redis://`` for the node, ``redis+cluster://`` for the cluster). A measurement gives ``P``
of them the same task; they start together behind a barrier and call ``Policy.hit`` on the
allowed path (a quota never reached) for ``--seconds``, each cycling through its own 1000
identities, so keys (whose hash tag is the identity) spread over every slot; rates are summed.
Three targets: ``1 node``; ``3 primaries``; and, as a control with the most processes only,
``1 of 3 primaries``: the cluster's clients with identities chosen so that every key is in the
first primary's slots (the same client work as ``3 primaries``, one primary as busy as the
node). The measurements of one repetition (target x algorithm x P) run in a shuffled (seeded)
order; figures are medians over ``--reps`` repetitions, and the x node ratio is the median of
the ratios to ``1 node`` within one repetition.

Around every measurement, on every primary: ``CONFIG RESETSTAT`` before, ``INFO commandstats``
after (``cmdstat_evalsha``: calls and usec, the script's execution time), and ``INFO cpu``
before and after (``used_cpu_user_main_thread + used_cpu_sys_main_thread``: the CPU time of the
thread that executes commands, reading requests and writing replies included). Each client
process reports its own CPU time (``time.process_time``), and /proc/stat the whole machine's, so
the output shows how many cores the servers, the clients and everything else kept busy.

Projection: a primary executes commands on one thread, so its ceiling is about 1e6 / (main
thread CPU us per decision) decisions/s (1e6 / usec_per_call if reading, parsing and replying
cost nothing: an upper bound), and N primaries, keys spread evenly, about N times that when the
clients are not the bottleneck. The basis is the target whose busiest primary was busiest with
the most processes (a server's CPU per decision falls as it gets busier). On a 2-core machine
the clients and the servers share the two cores, so the cluster cannot show that scaling here;
what transfers is the server microseconds per decision, hence the per-primary ceiling. The
output says so.

Every loop is bounded in count and time: each client call loop by ``--seconds`` (and
MAX_CALLS), every wait by a timeout, the repetitions by ``--max-seconds`` (a repetition is
started only when the previous one's duration still fits). The defaults take about 2.5 minutes,
``--quick`` about 30 s.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import queue
import random
import statistics
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from django_redislua.testing import RedisClusterServers, RedisServer  # noqa: E402

QUOTA = 1_000_000  # per hour: never exhausted by the allowed-path measurements
IDENTITIES = 1000  # per client process and measurement, cycled
MAX_CALLS = 50_000_000  # per client process and measurement: a count bound besides the clock
WARM_CALLS = 60  # per algorithm and process: the script is loaded on every primary
PRIMARIES = 3
STAT = "cmdstat_evalsha"
TARGETS = ("1 node", f"{PRIMARIES} primaries", f"1 of {PRIMARIES} primaries")
PINNED = TARGETS[2]  # the cluster, every key on its first primary (slots 0-5460)
PROJECT_UP_TO = 6  # primaries in the projection table
WAIT = 120.0  # seconds: the longest any barrier or queue wait may take
FIELDS = ("per_second", "usec_per_call", "main_cpu_us_per_decision", "all_cpu_us_per_decision",
          "exec_share", "server_cores", "busiest_primary_busy", "client_cpu_us_per_decision",
          "client_cores", "machine_cores", "other_cores")  # medians over repetitions

CAVEAT = (
    "This machine has {cpus} CPU(s). The client processes and the servers (1, or {n} for the "
    "cluster) share them with each other and with whatever else runs here (the other column), "
    "so the cluster cannot show its scaling: {n} primaries get no more CPU than 1 node, and the "
    "client processes, which need several times the server's CPU per decision, take most of "
    "it. The x node ratio measured here is therefore not the speed-up of a real cluster. What "
    "transfers to other machines is the server's CPU per decision, hence the per-primary "
    "ceiling and the projection per added primary, valid when every primary has a core of its "
    "own and enough client cores feed it (the client cores column)."
)


@dataclass
class Settings:
    seconds: float
    reps: int
    processes: tuple[int, ...]
    algorithms: tuple[str, ...]
    max_seconds: float
    seed: int


# -- set-up -------------------------------------------------------------------------------------

def setup_django(url: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_redislua"],
        REDISLUA={"CONNECTION": url, "SOCKET_TIMEOUT": 5,
                  # No metrics: the decision alone, as in bench_ratelimit.py.
                  "METRICS": []},
        SECRET_KEY="bench",
        USE_TZ=True,
    )
    django.setup()


def check_loopback(url: str) -> None:
    host = urlsplit(url).hostname or ""
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"refusing a non-loopback Redis ({host!r}): this benchmark floods it")


def policies(algorithms: tuple[str, ...]) -> dict[str, Any]:
    from django_redislua import Policy

    return {a: Policy(f"scale_{a}", rate=f"{QUOTA}/h", algorithm=a) for a in algorithms}


# -- client processes ---------------------------------------------------------------------------

def identities(policy: Any, prefix: str, pinned: bool) -> list[str]:
    """``IDENTITIES`` identities; with ``pinned`` only those whose key is in the first primary's
    slots (``RedisClusterServers`` gives primary 0 slots 0 to 16384 // primaries - 1)."""
    from redis.crc import key_slot

    if not pinned:
        return [f"{prefix}:{n}" for n in range(IDENTITIES)]
    first = 16384 // PRIMARIES
    found = []
    for n in range(IDENTITIES * PRIMARIES * 10):
        name = f"{prefix}:{n}"
        if key_slot(policy.redis_key(name).encode()) < first:
            found.append(name)
            if len(found) == IDENTITIES:
                break
    return found


def client_process(url: str, algorithms: tuple[str, ...], tasks: Any, results: Any,
                   barriers: dict[int, Any]) -> None:
    """A client: its own Django set-up and client for ``url``; runs tasks until None."""
    try:
        setup_django(url)
        found = policies(algorithms)
        for name, policy in found.items():  # connections, slot table, script loads
            for n in range(WARM_CALLS):
                policy.hit(f"warm:{os.getpid()}:{name}:{n}")
    except BaseException as exc:  # reported: the parent raises it
        results.put(("error", f"{os.getpid()}: {exc!r}"))
        return
    results.put(("ready", os.getpid()))
    for _ in range(1_000_000):  # a task per measurement; None ends the process
        try:
            task = tasks.get(timeout=3600)
        except queue.Empty:
            return
        if task is None:
            return
        algorithm, seconds, tag, parties, pinned = task
        try:
            call = found[algorithm].hit
            names = identities(found[algorithm], f"{tag}:{os.getpid()}", pinned)
            cycle = len(names)
            barriers[parties].wait(timeout=WAIT)
            clock = time.perf_counter
            cpu = time.process_time()
            start = clock()
            end = start + seconds
            count = denied = 0
            while count < MAX_CALLS and clock() < end:
                denied += not call(names[count % cycle]).allowed
                count += 1
            elapsed = clock() - start
            results.put(("done", {"count": count, "denied": denied, "seconds": elapsed,
                                  "cpu": time.process_time() - cpu}))
        except BaseException as exc:
            results.put(("error", f"{os.getpid()}: {exc!r}"))


class Clients:
    """``count`` spawned client processes of one target, ``P`` of them per measurement."""

    def __init__(self, url: str, s: Settings) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.count = max(s.processes)
        self.tasks, self.results = ctx.Queue(), ctx.Queue()
        # One barrier per P: the P clients of a measurement and this process.
        self.barriers = {p: ctx.Barrier(p + 1) for p in s.processes}
        self.procs = [ctx.Process(target=client_process, daemon=True,
                                  args=(url, s.algorithms, self.tasks, self.results,
                                        self.barriers))
                      for _ in range(self.count)]
        for proc in self.procs:
            proc.start()
        for _ in range(self.count):
            self.expect("ready")

    def expect(self, kind: str, timeout: float = WAIT) -> Any:
        got, value = self.results.get(timeout=timeout)
        if got != kind:
            raise RuntimeError(f"client process failed: {value}")
        return value

    def start(self, algorithm: str, seconds: float, tag: str, parties: int,
              pinned: bool) -> float:
        for _ in range(parties):
            self.tasks.put((algorithm, seconds, tag, parties, pinned))
        self.barriers[parties].wait(timeout=WAIT)
        return time.perf_counter()

    def collect(self, parties: int, seconds: float) -> list[dict[str, Any]]:
        return [self.expect("done", seconds + WAIT) for _ in range(parties)]

    def close(self) -> None:
        for _ in self.procs:
            self.tasks.put(None)
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)


# -- server statistics --------------------------------------------------------------------------

def server_cpu(admin: Any) -> tuple[float, float]:
    """CPU seconds of the server's main thread (all its threads on an older server without the
    figure) and of all its threads."""
    cpu = admin.info("cpu")
    every = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
    if "used_cpu_user_main_thread" in cpu:
        main = float(cpu["used_cpu_user_main_thread"]) + float(cpu["used_cpu_sys_main_thread"])
        return main, every
    return every, every


def machine_cpu() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not waiting for I/O) since boot,
    all cores together, from /proc/stat; NaN where there is none."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return float("nan")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass
class Target:
    name: str
    url: str
    admins: list[Any]  # one plain client per primary
    clients: Clients | None = None  # the pinned target shares the cluster's
    pinned: bool = False


def measure(target: Target, algorithm: str, parties: int, seconds: float,
            tag: str) -> dict[str, Any]:
    assert target.clients is not None
    admins = target.admins
    before = [server_cpu(a) for a in admins]
    machine_before = machine_cpu()
    for admin in admins:
        admin.config_resetstat()
    start = target.clients.start(algorithm, seconds, tag, parties, target.pinned)
    done = target.clients.collect(parties, seconds)
    wall = time.perf_counter() - start
    machine = machine_cpu() - machine_before
    stats = [a.info("commandstats").get(STAT, {}) for a in admins]
    after = [server_cpu(a) for a in admins]
    main_cpu = [a[0] - b[0] for a, b in zip(after, before, strict=True)]
    all_cpu = [a[1] - b[1] for a, b in zip(after, before, strict=True)]
    calls = [int(st.get("calls", 0)) for st in stats]
    usec = [float(st.get("usec", 0)) for st in stats]
    made = sum(d["count"] for d in done)
    total = sum(calls)
    return {
        "target": target.name, "algorithm": algorithm, "processes": parties,
        "per_second": sum(d["count"] / d["seconds"] for d in done),
        "decisions": made, "denied": sum(d["denied"] for d in done), "wall": wall,
        "server_calls": calls, "server_usec": usec,
        "failed_calls": sum(int(st.get("failed_calls", 0)) + int(st.get("rejected_calls", 0))
                            for st in stats),
        "usec_per_call": sum(usec) / max(1, total),
        "main_cpu_us_per_decision": 1e6 * sum(main_cpu) / max(1, total),
        "all_cpu_us_per_decision": 1e6 * sum(all_cpu) / max(1, total),
        "exec_share": sum(usec) / max(1e-9, 1e6 * sum(main_cpu)),
        "server_cores": sum(all_cpu) / wall,
        "busiest_primary_busy": max(main_cpu) / wall,
        "client_cpu_us_per_decision": 1e6 * sum(d["cpu"] for d in done) / max(1, made),
        "client_cores": sum(d["cpu"] for d in done) / wall,
        # Everything busy on the machine meanwhile, and what of it was neither the servers
        # nor the clients (other work; this process's own share is negligible).
        "machine_cores": machine / wall,
        "other_cores": (machine - sum(all_cpu) - sum(d["cpu"] for d in done)) / wall,
    }


# -- the run ------------------------------------------------------------------------------------

def run(targets: list[Target], s: Settings, rng: random.Random,
        deadline: float) -> tuple[int, list[dict[str, Any]]]:
    runs: list[dict[str, Any]] = []
    # The pinned target only with the most processes: a control, not a curve.
    plan = [(t, a, p) for t in targets for a in s.algorithms
            for p in (s.processes[-1:] if t.pinned else s.processes)]
    tag_base = rng.randrange(1 << 30)
    reps = 0
    rep_seconds = 0.0
    for rep in range(s.reps):
        began = time.monotonic()
        if rep and began + rep_seconds > deadline:
            print(f"... stopping after {rep} repetitions (--max-seconds)", file=sys.stderr,
                  flush=True)
            break
        rng.shuffle(plan)
        for target, algorithm, parties in plan:
            tag = f"sc:{tag_base}:{rep}:{target.name.replace(' ', '')}:{algorithm}:{parties}"
            row = measure(target, algorithm, parties, s.seconds, tag)
            row["rep"] = rep
            runs.append(row)
        reps += 1
        rep_seconds = time.monotonic() - began
        print(f"... repetition {rep + 1} of {s.reps} took {rep_seconds:.0f} s", file=sys.stderr,
              flush=True)
    return reps, runs


def summarize(runs: list[dict[str, Any]], s: Settings) -> dict[str, Any]:
    def pick(target: str, algorithm: str, parties: int) -> list[dict[str, Any]]:
        return [r for r in runs if r["target"] == target and r["algorithm"] == algorithm
                and r["processes"] == parties]

    rows = []
    for algorithm in s.algorithms:
        for parties in s.processes:
            for target in TARGETS:
                found = pick(target, algorithm, parties)
                if not found:
                    continue
                row: dict[str, Any] = {"target": target, "algorithm": algorithm,
                                       "processes": parties, "n": len(found)}
                for name in FIELDS:
                    row[name] = statistics.median(r[name] for r in found)
                row["per_second_min"] = min(r["per_second"] for r in found)
                row["per_second_max"] = max(r["per_second"] for r in found)
                if target != TARGETS[0]:
                    single = {r["rep"]: r["per_second"] for r in pick(TARGETS[0], algorithm,
                                                                      parties)}
                    ratios = [r["per_second"] / single[r["rep"]] for r in found
                              if r["rep"] in single]
                    row["x_node"] = statistics.median(ratios) if ratios else float("nan")
                rows.append(row)
    # How the cluster targets' decisions fell on its primaries, over all their measurements.
    spread = {}
    for target in TARGETS[1:]:
        calls = [0] * PRIMARIES
        for r in runs:
            if r["target"] == target:
                calls = [a + b for a, b in zip(calls, r["server_calls"], strict=True)]
        spread[target] = {"calls": calls, "shares": [c / max(1, sum(calls)) for c in calls]}
    # The projection, per algorithm, from the server cost with the most processes: of the
    # targets, the one whose busiest primary was busiest is the basis (a server's CPU per
    # decision falls as it gets busier: it wakes up less often per command).
    top = s.processes[-1]
    projection = []
    for algorithm in s.algorithms:
        entries = []
        for row in rows:
            if row["algorithm"] != algorithm or row["processes"] != top:
                continue
            ceiling = 1e6 / row["main_cpu_us_per_decision"]
            entries.append({
                "from": row["target"], "algorithm": algorithm, "processes": top,
                "usec_per_call": row["usec_per_call"],
                "main_cpu_us_per_decision": row["main_cpu_us_per_decision"],
                "busiest_primary_busy": row["busiest_primary_busy"],
                "per_primary": ceiling, "per_primary_exec_only": 1e6 / row["usec_per_call"],
                "client_cpu_us_per_decision": row["client_cpu_us_per_decision"],
                "client_cores_per_primary": ceiling * row["client_cpu_us_per_decision"] / 1e6,
                "basis": False,
            })
        if not entries:
            continue
        basis = max(entries, key=lambda e: e["busiest_primary_busy"])
        basis["basis"] = True
        basis["primaries"] = {n: n * basis["per_primary"] for n in range(1, PROJECT_UP_TO + 1)}
        projection += entries
    # Failures of any kind, over every measurement: none expected.
    problems = []
    for r in runs:
        where = f"{r['target']} {r['algorithm']} P={r['processes']} rep {r['rep']}"
        if r["denied"]:
            problems.append(f"{where}: {r['denied']} denied")
        if r["failed_calls"]:
            problems.append(f"{where}: {r['failed_calls']} failed EVALSHA")
        if sum(r["server_calls"]) != r["decisions"]:
            problems.append(f"{where}: {sum(r['server_calls'])} EVALSHA for {r['decisions']} "
                            "decisions")
    return {"rows": rows, "spread": spread, "projection": projection,
            "problems": problems[:10]}


# -- report -------------------------------------------------------------------------------------

def header(admin: Any, targets: list[Target], s: Settings) -> dict[str, Any]:
    import redis

    try:
        import hiredis

        hiredis_version = hiredis.__version__
    except ImportError:
        hiredis_version = "no"
    info = admin.info("server")
    cpus = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    return {
        "machine": f"{platform.node()} {platform.machine()} {cpus} CPUs ({usable} usable)",
        "cpus": usable,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "redis_py": redis.__version__,
        "hiredis": hiredis_version if redis.utils.HIREDIS_AVAILABLE else f"{hiredis_version} "
                   "(unused)",
        "server": f"{'valkey' if 'valkey_version' in info else 'redis'} "
                  f"{info.get('valkey_version', info['redis_version'])}",
        "io_threads": info.get("io_threads_active", "?"),
        "urls": {t.name: t.url for t in targets},
        "settings": vars(s),
    }


def print_report(report: dict[str, Any]) -> None:
    h = report["header"]
    st = h["settings"]
    print(f"# {h['machine']}, load {h['load_average']} at the start, "
          f"{report['load_after']} at the end, Python {h['python']}, redis-py {h['redis_py']}, "
          f"hiredis {h['hiredis']}, {h['server']}")
    print(f"# 1 node at {h['urls'][TARGETS[0]]}; {PRIMARIES} primaries, no replicas, at "
          f"{h['urls'][TARGETS[1]]}; Policy.hit, allowed path, {STAT}")
    print(f"# {st['seconds']} s per measurement, {report['reps']} of {st['reps']} repetitions, "
          f"processes {list(st['processes'])}, algorithms {list(st['algorithms'])}, "
          f"seed {st['seed']}, max {st['max_seconds']} s")
    summary = report["summary"]
    by_key = {(r["target"], r["algorithm"], r["processes"]): r for r in summary["rows"]}

    print(f"\n## Decisions/s (median [min - max] of {report['reps']} x {st['seconds']} s; "
          "x node: median over repetitions\nof the ratio to 1 node within one repetition; "
          f"{PINNED}: the cluster, every key on its first primary)")
    print(f"{'algorithm':<13} {'P':>2}" + "".join(f" {t:>28}" for t in TARGETS[:2])
          + f" {'x node':>6} {PINNED:>28} {'x node':>6}")
    for algorithm in st["algorithms"]:
        for parties in st["processes"]:
            line = f"{algorithm:<13} {parties:>2}"
            for target in TARGETS:
                r = by_key.get((target, algorithm, parties))
                if r is None:
                    line += f" {'':>28}" + (f" {'':>6}" if target != TARGETS[0] else "")
                    continue
                line += (f" {r['per_second']:>8.0f} [{r['per_second_min']:>7.0f} - "
                         f"{r['per_second_max']:>7.0f}]")
                if target != TARGETS[0]:
                    line += f" {r['x_node']:>6.3f}"
            print(line.rstrip())

    print("\n## Where the CPU goes (medians over repetitions; server figures summed over the "
          "target's primaries)")
    print(f"{'target':<18} {'algorithm':<13} {'P':>2} {'exec us':>8} {'main us':>8} "
          f"{'exec %':>7} {'busiest':>8} {'client us':>9} {'server':>6} {'client':>6} "
          f"{'other':>6} {'all':>5}")
    for algorithm in st["algorithms"]:
        for parties in st["processes"]:
            for target in TARGETS:
                r = by_key.get((target, algorithm, parties))
                if r is None:
                    continue
                print(f"{target:<18} {algorithm:<13} {parties:>2} {r['usec_per_call']:>8.2f} "
                      f"{r['main_cpu_us_per_decision']:>8.2f} {r['exec_share']:>7.1%} "
                      f"{r['busiest_primary_busy']:>8.1%} "
                      f"{r['client_cpu_us_per_decision']:>9.1f} {r['server_cores']:>6.2f} "
                      f"{r['client_cores']:>6.2f} {r['other_cores']:>6.2f} "
                      f"{r['machine_cores']:>5.2f}")
    print("exec us: EVALSHA usec_per_call (the script's execution), per decision; main us: CPU "
          "of the servers'\nmain threads per decision (requests read and parsed, the script, "
          "replies written); exec %: their\nratio; busiest: the busiest primary's main thread, "
          "share of one core; client us: client CPU per\ndecision; server, client, other, all: "
          "cores busy (CPU seconds per second) with the servers (all\nthreads), the client "
          f"processes, anything else, and in all (/proc/stat), of {h['cpus']}.")
    for target, got in summary["spread"].items():
        shares = ", ".join(f"{c} ({x:.1%})" for c, x in zip(got["calls"], got["shares"],
                                                           strict=True))
        print(f"EVALSHA calls per primary, {target}, all its measurements: {shares}")

    print(f"\n## Projection per primary (server cost with P = {st['processes'][-1]}; "
          "* = the basis: the busiest primary)")
    print(f"{'from':<18} {'algorithm':<13} {'busiest':>8} {'exec us':>8} {'main us':>8} "
          f"{'per primary':>12} {'exec only':>10} {'client us':>9} {'client cores':>12}")
    for p in summary["projection"]:
        mark = "*" if p["basis"] else " "
        print(f"{mark}{p['from']:<17} {p['algorithm']:<13} {p['busiest_primary_busy']:>8.1%} "
              f"{p['usec_per_call']:>8.2f} {p['main_cpu_us_per_decision']:>8.2f} "
              f"{p['per_primary']:>12.0f} {p['per_primary_exec_only']:>10.0f} "
              f"{p['client_cpu_us_per_decision']:>9.1f} {p['client_cores_per_primary']:>12.1f}")
    print("per primary: 1e6 / main us, the decisions/s one primary's thread does when busy all "
          "the time;\nexec only: 1e6 / exec us, the bound if reading and replying cost nothing; "
          "client cores: the\nclient CPU (of this machine's kind, that target's client) one "
          "primary at that ceiling needs.")
    print(f"{'N primaries':<26}" + "".join(f"{n:>10}" for n in range(1, PROJECT_UP_TO + 1)))
    for p in summary["projection"]:
        if p["basis"]:
            print(f"{p['algorithm'] + ' decisions/s':<26}" + "".join(
                f"{p['primaries'][n]:>10.0f}" for n in range(1, PROJECT_UP_TO + 1)))
    print("(N x per primary from the basis: each added primary adds one per-primary ceiling, "
          "when keys\nspread evenly, every primary has a core of its own and the clients keep "
          "up)")
    if summary["problems"]:
        print(f"\nPROBLEMS: {summary['problems']}")

    print("\n## What this machine can and cannot show")
    print(textwrap.fill(report["caveat"], width=100))
    print(f"run took {report['seconds']:.0f} s")


# -- main ---------------------------------------------------------------------------------------

def settings_from(options: argparse.Namespace) -> Settings:
    quick = options.quick

    def pick(value: Any, full: Any, fast: Any) -> Any:
        return value if value is not None else (fast if quick else full)

    processes = pick(options.processes, "2,4,8", "2,4")
    settings = Settings(
        seconds=pick(options.seconds, 2.0, 1.0),
        reps=pick(options.reps, 5, 2),
        processes=tuple(sorted({int(n) for n in processes.split(",")})),
        algorithms=tuple(a for a in options.algorithms.split(",") if a),
        max_seconds=pick(options.max_seconds, 300.0, 50.0),
        seed=options.seed,
    )
    if not settings.processes or min(settings.processes) < 1 or max(settings.processes) > 64:
        raise SystemExit("--processes: counts from 1 to 64")
    if not 0 < settings.seconds <= 60 or not 0 < settings.reps <= 100:
        raise SystemExit("--seconds: (0, 60]; --reps: 1 to 100")
    return settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="an under-a-minute smoke run")
    parser.add_argument("--seconds", type=float, help="per measurement (default 2, quick 1)")
    parser.add_argument("--reps", type=int, help="repetitions (default 5, quick 2)")
    parser.add_argument("--processes", help="client process counts (default 2,4,8; quick 2,4)")
    parser.add_argument("--algorithms", default="fixed_window,gcra")
    parser.add_argument("--json", type=Path, help="write every figure as JSON here")
    parser.add_argument("--max-seconds", type=float,
                        help="no repetition starts past this (default 300, quick 50)")
    parser.add_argument("--seed", type=int, default=20240615)
    options = parser.parse_args(argv)
    s = settings_from(options)
    rng = random.Random(s.seed)
    began = time.monotonic()
    deadline = began + s.max_seconds

    with RedisServer() as node, RedisClusterServers(primaries=PRIMARIES, replicas=0) as cluster:
        primaries = [srv.client() for srv in cluster.servers]
        targets = [Target(TARGETS[0], node.url, [node.client()]),
                   Target(TARGETS[1], cluster.url, primaries),
                   Target(PINNED, cluster.url, primaries, pinned=True)]
        for target in targets:
            check_loopback(target.url)
        report: dict[str, Any] = {"header": header(targets[0].admins[0], targets, s)}
        try:
            for target in targets[:2]:
                step = time.monotonic()
                target.clients = Clients(target.url, s)
                print(f"... {target.clients.count} client processes for {target.name} ready in "
                      f"{time.monotonic() - step:.0f} s", file=sys.stderr, flush=True)
            targets[2].clients = targets[1].clients  # the pinned runs: the cluster's clients
            reps, runs = run(targets, s, rng, deadline)
        finally:
            for target in targets[:2]:
                if target.clients is not None:
                    target.clients.close()
            for admin in [*targets[0].admins, *primaries]:
                admin.close()
    report["reps"] = reps
    report["runs"] = runs
    report["summary"] = summarize(runs, s)
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    report["seconds"] = time.monotonic() - began
    report["caveat"] = CAVEAT.format(cpus=report["header"]["cpus"], n=PRIMARIES)
    print_report(report)
    if options.json is not None:
        options.json.write_text(json.dumps(report, indent=1, default=str))
        print(f"json: {options.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
