"""The app under gunicorn while its Redis Cluster is down, then while the cluster comes up.

The deployment names ``redis+cluster://127.0.0.1:PORT`` and nothing listens there yet. Every
request to a ``@ratelimit`` view must still get an answer: 200 with FAIL_OPEN, 503 with
Retry-After without it, never a 500, with at most one outage warning per worker in the log and
no Django error line per 503. Then the cluster starts on that port while requests keep coming:
within 2 s of every node saying cluster_state:ok, every worker (each has its own client, and
its own 1 s back-off after a failed build) decides again, which the access log shows per
worker pid; and decisions are exact: the view's 3 a minute, shared by both workers.
"""

from __future__ import annotations

import http.client
import itertools
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
import redis
from django.conf import settings

from django_redislua.limiting import denials
from django_redislua.testing import RedisClusterServers, free_cluster_port, free_port
from tests.processes import stop_group

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 2
VIEW = "/rl/inline/"  # tests/testapp/ratelimit_views.py: @ratelimit(rate="3/m", key="ip")
LIMIT = 3
BOOT_PATH = "/rl/ok/"  # undecorated: answers without Redis
BOOT_TIMEOUT = 30.0
OUTAGE_REQUESTS, OUTAGE_TIMEOUT = 30, 20.0
CLIENT_THREADS = 4  # more than WORKERS, so both sync workers are kept busy
PACE = 0.03  # seconds between two requests of one client thread
RECOVERY_BOUND = 2.0  # the acceptance: exact decisions within 2 s of the cluster being up
OBSERVE = RECOVERY_BOUND + 1.0  # traffic kept up after the cluster is up, to see it recover
# gunicorn's access log: worker pid (<pid>), query string (our request number), status, and
# the RateLimit header ("-" when absent), last as it holds spaces.
ACCESS_FORMAT = "ACCESS pid=%(p)s q=%(q)s status=%(s)s ratelimit=%({ratelimit}o)s"
ACCESS_LINE = re.compile(r"^ACCESS pid=<(\d+)> q=n=(\d+) status=(\d+) ratelimit=(.*)$")
OUTAGE_WARNING = re.compile(r"^WARNING django_redislua pid=(\d+) Redis is unreachable")


@dataclass(frozen=True)
class Answer:
    number: int  # the request's ?n=, to find it in the access log
    sent: float  # time.monotonic()
    done: float
    status: int
    headers: dict[str, str]

    @property
    def decided(self) -> bool:
        """Redis decided this request: the response carries the RateLimit header."""
        return "ratelimit" in self.headers


_numbers = itertools.count()


def ask(port: int, timeout: float = 5.0) -> Answer:
    number = next(_numbers)
    sent = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", f"{VIEW}?n={number}")
        response = conn.getresponse()
        response.read()
        headers = {k.lower(): v for k, v in response.getheaders()}
        return Answer(number, sent, time.monotonic(), response.status, headers)
    finally:
        conn.close()


def status_of(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def outage_warnings(log: str) -> Counter[int]:
    """How many "Redis is unreachable" warnings each process logged."""
    return Counter(int(m.group(1)) for m in map(OUTAGE_WARNING.match, log.splitlines()) if m)


def children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (Linux /proc): gunicorn's workers."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended meanwhile
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


@dataclass
class Served:
    port: int
    process: subprocess.Popen[bytes]
    log: IO[bytes]

    def log_text(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def access(self, numbers: set[int], timeout: float = 5.0) -> dict[int, tuple[int, int, bool]]:
        """``{number: (worker pid, status, RateLimit header sent)}`` for the requests given.

        gunicorn writes an access line after the response is sent: wait for them, bounded.
        """
        deadline = time.monotonic() + timeout
        while True:
            lines = {}
            for line in self.log_text().splitlines():
                match = ACCESS_LINE.match(line)
                if match:
                    pid, number, status, ratelimit = match.groups()
                    lines[int(number)] = (int(pid), int(status), ratelimit != "-")
            if numbers <= lines.keys() or time.monotonic() > deadline:
                missing = numbers - lines.keys()
                assert not missing, f"no access line for {len(missing)} requests"
                return lines
            time.sleep(0.1)


@contextmanager
def serving(connection: str, fail_open: bool) -> Iterator[Served]:
    """The test project under gunicorn (2 sync workers), its log in a temporary file."""
    port = free_port()
    env = {
        **os.environ,
        "REDIS_URL": settings.REDIS_URL,  # tests.settings starts no server of its own
        "DJANGO_SETTINGS_MODULE": "tests.deploy_settings",
        "REDISLUA_CONNECTION": connection,
        "REDISLUA_FAIL_OPEN": "1" if fail_open else "0",
    }
    env.pop("PYTHONWARNINGS", None)
    command = [
        sys.executable, "-m", "gunicorn", "--workers", str(WORKERS),
        "--bind", f"127.0.0.1:{port}", "--access-logfile", "-",
        "--access-logformat", ACCESS_FORMAT, "tests.wsgi:application",
    ]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True
        )
        served = Served(port, process, log)
        try:
            deadline = time.monotonic() + BOOT_TIMEOUT
            while True:
                try:
                    if status_of(port, BOOT_PATH) == 200:
                        break
                except OSError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"gunicorn did not start:\n{served.log_text()[-3000:]}")
                time.sleep(0.2)
            yield served
        finally:
            stop_group(process)


class Traffic:
    """``CLIENT_THREADS`` threads asking the view, each every PACE seconds, until stopped."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.answers: list[Answer] = []
        self.errors: list[BaseException] = []
        self.failed_at: list[tuple[float, float]] = []  # (sent, failed), time.monotonic()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run) for _ in range(CLIENT_THREADS)]

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                self.answers.append(ask(self.port))
            except OSError as exc:  # a request that gets no answer at all fails the test
                self.errors.append(exc)
                self.failed_at.append((sent, time.monotonic()))
            self._stop.wait(PACE)

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)


class ClusterWatch:
    """Polls every started node's CLUSTER INFO every 10 ms while the cluster starts: when did a
    first node, then all of them, say cluster_state:ok (time.monotonic())?

    start() polls too, but sleeps 0.1 s between rounds; this is the moment to measure from.
    """

    def __init__(self, cluster: RedisClusterServers) -> None:
        self.cluster = cluster
        self.first_ok: float | None = None
        self.all_ok: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        clients: dict[int, redis.Redis] = {}
        try:
            while self.all_ok is None and not self._stop.wait(0.01):
                states = []
                for server in list(self.cluster.servers):
                    if server.port not in clients:
                        clients[server.port] = server.client(
                            socket_timeout=0.5, decode_responses=True
                        )
                    try:
                        states.append(clients[server.port].cluster("INFO")["cluster_state"])
                    except redis.RedisError:
                        states.append("unreachable")
                now = time.monotonic()
                if self.first_ok is None and "ok" in states:
                    self.first_ok = now
                if len(states) == self.cluster.primaries and set(states) == {"ok"}:
                    self.all_ok = now
        finally:
            for client in clients.values():
                client.close()

    def wait_all_ok(self, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while self.all_ok is None:
            assert time.monotonic() < deadline, "the watch never saw every node ok"
            time.sleep(0.01)
        return self.all_ok

    def __enter__(self) -> ClusterWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.parametrize("fail_open", [True, False], ids=["fail_open", "fail_closed"])
def test_cluster_down_then_up_under_gunicorn(fail_open: bool) -> None:
    port = free_cluster_port()  # the cluster's first node, once it exists
    cluster = RedisClusterServers(primaries=3, replicas=0, first_port=port)
    undecided_status = 200 if fail_open else 503
    try:
        with serving(f"redis+cluster://127.0.0.1:{port}", fail_open) as served:
            workers = children(served.process.pid)
            assert len(workers) == WORKERS, workers

            # 1. The cluster is down: every request is answered, none by a 500.
            with ThreadPoolExecutor(CLIENT_THREADS) as pool:
                futures = [pool.submit(ask, served.port) for _ in range(OUTAGE_REQUESTS)]
                done, not_done = wait(futures, timeout=OUTAGE_TIMEOUT)
            assert not not_done, f"{len(not_done)} requests unanswered in {OUTAGE_TIMEOUT}s"
            outage = [future.result() for future in done]
            assert Counter(a.status for a in outage) == {undecided_status: OUTAGE_REQUESTS}
            assert not any(a.decided for a in outage)
            if not fail_open:
                assert {a.headers.get("retry-after") for a in outage} == {"1"}
            log = served.log_text()
            warned = outage_warnings(log)
            # One warning per worker per minute (this test lasts less), from the workers only.
            assert warned and set(warned) <= workers, log[-3000:]
            assert max(warned.values()) == 1, warned
            assert "ERROR" not in log and "Traceback" not in log, log[-3000:]

            # 2. The cluster comes up on that port while requests keep arriving.
            with Traffic(served.port) as traffic, ClusterWatch(cluster) as watch:
                time.sleep(0.3)  # the workers' back-offs are running when the cluster starts
                asked_to_start = time.monotonic()
                cluster.start()  # returns once every node has said cluster_state:ok
                up = watch.wait_all_ok(timeout=2.0)
                while time.monotonic() < up + OBSERVE:
                    time.sleep(0.05)
            # Said when one fails (seen once under a full local run, not reproduced since):
            # when the unanswered requests were sent against the cluster's start, and what
            # the workers logged.
            assert not traffic.errors, (
                traffic.errors[:3],
                [(round(s - asked_to_start, 2), round(f - asked_to_start, 2))
                 for s, f in traffic.failed_at[:3]],
                f"all ok at {up - asked_to_start:.2f}s", served.log_text()[-4000:])
            answers = traffic.answers
            logged = served.access({a.number for a in answers})
            assert {a.status for a in answers} <= {200, 429, undecided_status}
            assert {status for _, status, _ in logged.values()} <= {200, 429, undecided_status}
            recovered_at: dict[int, float] = {}
            for worker in workers:
                mine = sorted((a for a in answers if logged[a.number][0] == worker),
                              key=lambda a: a.sent)
                last_undecided = max((a.done for a in mine if not a.decided), default=None)
                after = [a for a in mine if last_undecided is None or a.sent > last_undecided]
                assert after, f"worker {worker} never decided after the cluster came up"
                for a in mine:  # undecided: the FAIL_OPEN 200 or the 503, never a bare 429
                    assert a.decided or a.status == undecided_status, a
                recovered_at[worker] = after[0].done
            recovery = max(recovered_at.values()) - up
            assert watch.first_ok is not None
            print(
                f"fail_open={fail_open}: cluster_state:ok on a first node "
                f"{watch.first_ok - asked_to_start:.2f}s after start(), on all "
                f"{up - asked_to_start:.2f}s after; every worker decided {recovery:+.3f}s after "
                f"all were ok ({ {w: round(t - up, 3) for w, t in recovered_at.items()} }); "
                f"{len(answers)} requests meanwhile, the slowest answered in "
                f"{max(a.done - a.sent for a in answers):.2f}s"
            )
            assert recovery <= RECOVERY_BOUND, recovered_at
            # Exact while recovering: both workers share one count, in the cluster.
            decided_ok = [a for a in answers if a.decided and a.status == 200]
            assert len(decided_ok) == LIMIT, Counter((a.status, a.decided) for a in answers)

            # 3. A fresh count: exactly 3 of 8, whichever worker answers.
            for server in cluster.servers:  # replicas=0: every node is a primary
                client = server.client()
                client.flushall()
                client.close()
            # A reset elsewhere reaches the workers' local denial cache within its horizon.
            time.sleep(denials.HORIZON_US / 1e6)
            exact = [ask(served.port) for _ in range(LIMIT + 5)]
            assert [a.status for a in exact] == [200] * LIMIT + [429] * 5
            assert all(a.decided for a in exact)
            assert all(int(a.headers["retry-after"]) >= 1 for a in exact[LIMIT:])

            # 4. The log: still one outage warning per worker, no error line, no traceback.
            log = served.log_text()
            warned = outage_warnings(log)  # a worker idle in step 1 may have warned in step 2
            assert set(warned) <= workers and max(warned.values()) == 1, warned
            assert "ERROR" not in log and "Traceback" not in log, log[-3000:]
            assert " status=500 " not in log
    finally:
        cluster.stop()
