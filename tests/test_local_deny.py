"""The local denial cache (django_redislua/limiting/denials.py) against real Redis.

What it must never do is admit, or deny longer than Redis would: every local answer is checked
against what Redis itself decides at the same instant (a peek, which bypasses the cache), with
injected time, so nothing here depends on timings except the one real-clock variant of "a reset
in another process is honoured within 1 s". Floods prove the cache was really in play (local
answers counted, EVALSHA counted with MONITOR), so no test can pass with the cache turned off.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from io import StringIO
from pathlib import Path
from typing import Any, NamedTuple, cast

import pytest
import redis
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client, override_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from redis.cluster import RedisCluster
from redis.crc import key_slot
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory, force_authenticate
from rest_framework.views import APIView

from django_redislua import drf
from django_redislua.checks import check_settings
from django_redislua.connection import get_client
from django_redislua.endpoints import parse_url
from django_redislua.limiting import Decision, Policy, denials, engine, get_policy
from django_redislua.limiting.inspect import reset_key
from django_redislua.signals import rate_limited
from django_redislua.testing import CommandRecorder

pytestmark = pytest.mark.topologies

ROOT = Path(__file__).resolve().parent.parent
US = 1_000_000
HORIZON = denials.HORIZON_US
# 1_700_000_000 s is 20 s into a minute: a fixed window of a minute or more holds T .. T + 40 s.
T = 1_700_000_000_000_000
ALGORITHMS = [
    "fixed_window", "sliding_log", "sliding_window", "token_bucket", "leaky_bucket", "gcra",
]
BUCKETS = {"token_bucket", "leaky_bucket", "gcra"}
# REDISLUA_PROPERTY_EXAMPLES=500 for a deeper hunt than the quick default.
MODEL_SETTINGS = hypothesis_settings(
    max_examples=int(os.environ.get("REDISLUA_PROPERTY_EXAMPLES", "60")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def hit(policy: Policy, identity: str, cost: int = 1, now: int | None = None,
        client: Any = None) -> Decision:
    return engine.evaluate([(policy, identity, cost)], now_us=now, client=client)[0]


def peek(policy: Policy, identity: str, cost: int = 1, now: int | None = None,
         client: Any = None) -> Decision:
    """What Redis decides at ``now`` (peeks never read the local cache)."""
    return engine.evaluate([(policy, identity, cost)], peek=True, now_us=now, client=client)[0]


def deny_then_local(policy: Policy, identity: str, now: int | None = None) -> Decision:
    """Spend ``identity``'s quota until Redis denies; prove the next hit is answered locally.
    Returns Redis's denial."""
    for _ in range(policy.limit + 1):
        denied = hit(policy, identity, now=now)
        if not denied.allowed:
            break
    assert not denied.allowed and not denied.local
    again = hit(policy, identity, now=now)
    assert again.local and not again.allowed
    assert policy.redis_key(identity) in denials._entries
    return denied


def redislua(**changes: Any) -> override_settings:
    return override_settings(REDISLUA={**django_settings.REDISLUA, **changes})


def connection_url() -> str:
    """The Redis the app uses now: the single server, or the cluster in a [cluster] run."""
    url = django_settings.REDISLUA["CONNECTION"]
    assert isinstance(url, str)
    return url


def another_connection(key: str) -> redis.Redis:
    """A client of its own (not the app's, no shared pool) on the server that holds ``key``:
    the single server, or on a cluster the primary that owns the key's slot."""
    endpoint = parse_url(connection_url())
    if endpoint.kind == "cluster":
        app = get_client()
        assert isinstance(app, RedisCluster)
        node = app.get_node_from_key(key)  # where the key lives (no command is sent)
        return redis.Redis(host=node.host, port=node.port)
    assert endpoint.kind == "single"
    return redis.Redis.from_url(endpoint.url)


class TransactionalClient:
    """``client=`` for evaluate: each EVALSHA runs in MULTI/EXEC with PERSIST of its keys, so
    real time cannot expire state that injected time still needs (as tests/test_engine_properties
    does). On a cluster the transaction runs on the primary that owns the keys' slot (a script's
    keys share one: the identity's hash tag), as MULTI/EXEC can only run on one node."""

    def __init__(self, client: redis.Redis | RedisCluster) -> None:
        self.client = client

    def execute_command(self, command: str, *args: Any) -> Any:
        if command == "SCRIPT LOAD":
            return self.client.script_load(*args)  # a cluster: on every primary
        assert command == "EVALSHA"
        sha, numkeys, *keys_and_args = args
        keys = keys_and_args[:numkeys]
        node = self.client
        if isinstance(node, RedisCluster):
            assert len({key_slot(str(key).encode()) for key in keys}) == 1, keys
            node = node.get_redis_connection(node.get_node_from_key(keys[0]))
        pipe = node.pipeline(transaction=True)
        pipe.evalsha(sha, numkeys, *keys_and_args)
        for key in keys:
            pipe.persist(key)
        replies = pipe.execute(raise_on_error=False)
        if isinstance(replies[0], Exception):
            raise replies[0]
        return replies[0]


# -- 1. the model: every local answer is what Redis says at that instant -----------------------

@st.composite
def policies(draw: st.DrawFn, algorithm: str) -> Policy:
    count = draw(st.integers(1, 5))
    # 1 s: denials shorter than the horizon; 10 s: the horizon cuts them.
    period = draw(st.sampled_from([1, 2, 10]))
    burst = draw(st.none() | st.integers(1, 5)) if algorithm in BUCKETS else None
    return Policy("model", rate=f"{count}/{period}s", algorithm=algorithm, burst=burst)


def steps(period_us: int) -> st.SearchStrategy[int]:
    return st.one_of(
        st.just(0),
        st.integers(1, 2_000),
        st.integers(0, 400_000),
        st.integers(HORIZON - 2_000, HORIZON + 2_000),  # around the horizon
        st.integers(0, 2 * period_us),
    )


class Scenario(NamedTuple):
    """A policy, the instant the run starts, and its hits: (step in us, identity, cost), a
    cost of None being the identity's previous one (1 at first)."""

    policy: Policy
    start: int
    hits: list[tuple[int, str, int | None]]


@st.composite
def scenarios(draw: st.DrawFn, algorithm: str) -> Scenario:
    # Drawn whole, in one strategy built once per policy (not a data.draw per value, which
    # builds and validates a strategy each time: most of this module's CPU went there).
    policy = draw(policies(algorithm))
    assert policy.rate is not None
    period_us = policy.rate.period_us
    hit = st.tuples(steps(period_us), st.sampled_from(["alice", "alice", "alice", "bob"]),
                    st.none() | st.integers(1, policy.limit))
    start = T + draw(st.integers(0, period_us))
    count = draw(st.integers(1, 40))  # as many as drawn (a list's own sizes run short)
    return Scenario(policy, start, draw(st.lists(hit, min_size=count, max_size=count)))


# A gating companion policy that always allows: with it, each hit goes through the
# multi-check plan (engine._Plan) instead of the single-check path (engine._One).
COMPANION = Policy("companion", rate="1000000/s")


def run_model(scenario: Scenario, tx: TransactionalClient, tally: Counter[str],
              plan: bool) -> None:
    policy = scenario.policy
    fixed = policy.code == "fw"
    now = scenario.start
    # identity -> (sent, cost, retry_after us) of Redis's newest denial since it last admitted:
    # what the cache may answer from, and until when.
    source: dict[str, tuple[int, int, int]] = {}
    last_cost: dict[str, int] = {}
    for step, identity, drawn_cost in scenario.hits:
        now += step
        cost = last_cost.get(identity, 1) if drawn_cost is None else drawn_cost
        last_cost[identity] = cost
        redis_says = peek(policy, identity, cost, now, tx)  # before the hit: peeks write nothing
        if plan:
            decision, companion = engine.evaluate(
                [(policy, identity, cost), (COMPANION, identity, 1)], now_us=now,
                client=cast(Any, tx))  # a stand-in: it has execute_command
            assert companion.allowed and not companion.local
        else:
            decision = hit(policy, identity, cost, now, tx)
        known = source.get(identity)
        expect_local = known is not None and (
            now < known[0] + min(known[2], HORIZON)
            and (cost == known[1] or (fixed and cost > known[1])))
        assert decision.local == expect_local, (decision, known, now)
        assert decision.limit == policy.limit and decision.policy is policy
        assert decision.key == identity
        if decision.local:
            assert known is not None
            tally["local"] += 1
            # Never admits; never denies what Redis would admit; the wait and reset are Redis's.
            assert not decision.allowed
            assert not redis_says.allowed
            assert decision.retry_after == redis_says.retry_after > 0
            assert decision.reset_after == redis_says.reset_after
            assert 0 <= decision.remaining <= redis_says.remaining
            if cost == 1 or fixed:
                assert decision.remaining == redis_says.remaining
            assert now - known[0] < HORIZON  # never beyond 1 s after the denial it came from
            # The wait is the real one: admitted then, not 1 us sooner (and not later).
            wait_us = round(decision.retry_after * US)
            assert peek(policy, identity, cost, now + wait_us, tx).allowed
            assert not peek(policy, identity, cost, now + wait_us - 1, tx).allowed
            continue
        tally["redis"] += 1
        assert decision.allowed == redis_says.allowed
        if decision.allowed:
            source.pop(identity, None)  # Redis admitted on the key: the entry is dropped
        else:
            tally["redis denial"] += 1
            assert (decision.remaining, decision.reset_after, decision.retry_after) == (
                redis_says.remaining, redis_says.reset_after, redis_says.retry_after)
            source[identity] = (now, cost, round(decision.retry_after * US))


@pytest.mark.parametrize("path", ["one", "plan"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_local_denials_are_what_redis_decides_at_that_instant(
    algorithm: str, path: str, r: redis.Redis | RedisCluster
) -> None:
    tally: Counter[str] = Counter()

    @MODEL_SETTINGS
    @given(scenario=scenarios(algorithm))
    def run(scenario: Scenario) -> None:
        r.flushall()
        denials.forget()
        run_model(scenario, TransactionalClient(r), tally, path == "plan")

    run()
    # Not vacuous: the cache answered (about a third of all hits do), and Redis denied too.
    assert tally["local"] >= 10 and tally["redis denial"] >= 10, tally


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_costs_an_entry_answers_and_an_admission_drops_it(algorithm: str) -> None:
    policy = Policy("costs", rate="4/m", algorithm=algorithm)
    assert hit(policy, "u", 3, now=T).allowed  # 1 left
    denied = hit(policy, "u", 2, now=T)
    assert not denied.allowed and not denied.local
    assert hit(policy, "u", 2, now=T + 1).local
    # A larger cost: only a fixed window's wait does not depend on the cost.
    larger = hit(policy, "u", 3, now=T + 2)
    assert larger.local == (algorithm == "fixed_window")
    assert not larger.allowed
    assert larger.retry_after == peek(policy, "u", 3, now=T + 2).retry_after
    # A smaller cost asks Redis, which admits it: the remaining quota changed, entry dropped.
    smaller = hit(policy, "u", 1, now=T + 3)
    assert smaller.allowed and not smaller.local
    assert policy.redis_key("u") not in denials._entries
    after = hit(policy, "u", 2, now=T + 4)
    assert not after.local and not after.allowed and after.remaining == 0


# -- 2. a reset in another process -------------------------------------------------------------

CHILD = textwrap.dedent("""
    import io, json, sys, time
    import django
    import tests.settings
    tests.settings.REDISLUA["CONNECTION"] = sys.argv[1]  # the parent's: a server, or a cluster
    django.setup()
    from django.conf import settings
    assert settings.REDISLUA["CONNECTION"] == sys.argv[1]
    from django.core.management import call_command
    from django_redislua.connection import get_client
    from django_redislua.limiting import get_policy
    from django_redislua.limiting.inspect import reset_key
    from django_redislua import overrides
    print(json.dumps({"ready": type(get_client()).__name__}), flush=True)
    for line in sys.stdin:
        order = json.loads(line)
        kind, name, identity = order["kind"], order["policy"], order["identity"]
        if kind == "command":
            out = io.StringIO()
            call_command("redislua_reset", name, identity, stdout=out)
            done = "reset rl:" in out.getvalue()
        elif kind == "policy":
            done = get_policy(name).reset(identity)
        elif kind in ("block", "allow"):  # a live override (django_redislua.overrides)
            done = getattr(overrides, kind)(name, identity, ttl="1m").kind == kind
        elif kind == "clear":
            done = overrides.clear(name, identity)
        else:  # what the admin's reset button calls
            done = reset_key(get_policy(name).redis_key(identity))
        print(json.dumps({"reset": done, "at": time.monotonic()}), flush=True)
""")
KINDS = ["command", "policy", "admin"]


class OtherProcess:
    """A separate Django process on the same Redis that resets keys when told to."""

    def __init__(self, process: subprocess.Popen[str], log: Path) -> None:
        self.process, self.log = process, log

    def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 60)
        line = self.process.stdout.readline() if ready else ""
        assert line, f"the other process did not answer: {self.log.read_text()}"
        return json.loads(line)  # type: ignore[no-any-return]

    def reset(self, kind: str, policy: str, identity: str) -> float:
        """Reset there; the monotonic time (system-wide) when its reset was done."""
        assert self.process.stdin is not None
        order = {"kind": kind, "policy": policy, "identity": identity}
        self.process.stdin.write(json.dumps(order) + "\n")
        self.process.stdin.flush()
        reply = self.read()
        assert reply["reset"] is True, reply  # it really deleted the state
        return float(reply["at"])


class OtherProcesses:
    """The other processes of this module, started when first needed: one per Redis the app
    used (the single server, the cluster), each configured for it from its start."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: dict[str, OtherProcess] = {}

    def on(self, url: str) -> OtherProcess:
        other = self.started.get(url)
        if other is None:
            log = self.directory / f"stderr-{len(self.started)}.log"
            env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
                   "PYTHONPATH": str(ROOT)}
            with log.open("w") as stderr:
                process = subprocess.Popen(
                    [sys.executable, "-c", CHILD, url], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=stderr, cwd=ROOT, env=env, text=True,
                )
            other = self.started[url] = OtherProcess(process, log)
            # Its client is of the kind this process uses: a RedisCluster in a [cluster] run.
            assert other.read() == {"ready": type(get_client()).__name__}
        return other

    def stop(self) -> None:
        for other in self.started.values():
            process = other.process
            assert process.stdin is not None
            process.stdin.close()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            assert process.stdout is not None
            process.stdout.close()


@pytest.fixture(scope="module")
def other_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OtherProcesses]:
    assert os.environ.get("REDIS_URL"), "tests/settings.py exports the shared server's URL"
    processes = OtherProcesses(tmp_path_factory.mktemp("other"))
    try:
        yield processes
    finally:
        processes.stop()


@pytest.fixture
def other_process(other_processes: OtherProcesses) -> OtherProcess:
    """Another Django process on the Redis this test's topology uses."""
    return other_processes.on(connection_url())


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_reset_on_another_connection_is_seen_one_second_after_the_denial(
    algorithm: str
) -> None:
    """Injected time. Another process's reset is a DEL this process does not hear of."""
    policy = Policy("elsewhere", rate="1/m", algorithm=algorithm)
    other = another_connection(policy.redis_key("ip"))
    try:
        assert hit(policy, "ip", now=T).allowed
        denied = hit(policy, "ip", now=T)
        assert not denied.allowed and not denied.local and denied.retry_after > 1
        assert other.delete(policy.redis_key("ip")) == 1
    finally:
        other.close()
    stale = hit(policy, "ip", now=T + HORIZON // 2)
    assert stale.local and not stale.allowed  # unseen for now: by design, for under 1 s
    assert hit(policy, "ip", now=T + HORIZON - 1).local
    seen = hit(policy, "ip", now=T + HORIZON)
    assert seen.allowed and not seen.local


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_without_a_reset_the_denial_is_asked_again_after_one_second(algorithm: str) -> None:
    policy = Policy("horizon", rate="1/m", algorithm=algorithm)
    assert hit(policy, "ip", now=T).allowed
    assert not hit(policy, "ip", now=T).local
    assert hit(policy, "ip", now=T + HORIZON - 1).local
    asked = hit(policy, "ip", now=T + HORIZON)
    assert not asked.local and not asked.allowed  # Redis again: still denied, entry renewed
    assert asked.retry_after == peek(policy, "ip", now=T + HORIZON).retry_after
    assert hit(policy, "ip", now=T + HORIZON + 1).local


@pytest.mark.parametrize("kind", KINDS)
def test_a_reset_in_a_real_other_process_injected_time(kind: str,
                                                       other_process: OtherProcess) -> None:
    policy = get_policy("login")
    deny_then_local(policy, "203.0.113.9", now=T)
    other_process.reset(kind, "login", "203.0.113.9")
    assert hit(policy, "203.0.113.9", now=T + HORIZON // 2).local
    seen = hit(policy, "203.0.113.9", now=T + HORIZON)
    assert seen.allowed and not seen.local


SLACK = 0.3  # polling every 50 ms, and a loaded machine's scheduling


@pytest.mark.parametrize("kind", KINDS)
def test_a_reset_in_a_real_other_process_is_honoured_within_one_second(
    kind: str, other_process: OtherProcess
) -> None:
    """Real clocks: admitted again at most 1 s (plus polling slack) after the other process's
    reset, and after the denial the entry came from."""
    policy = get_policy("login")
    identity = f"198.51.100.{KINDS.index(kind)}"
    for _ in range(policy.limit):
        assert policy.hit(identity).allowed
    before = time.monotonic()  # the denial's entry lasts until (its send time) + 1 s, no less
    denied = policy.hit(identity)
    assert not denied.allowed and not denied.local
    reset_at = other_process.reset(kind, "login", identity)
    decision = policy.hit(identity)
    if time.monotonic() - before < 0.9:
        assert decision.local and not decision.allowed  # the reset is not seen yet
    while not decision.allowed:
        assert not decision.allowed and decision.local, decision  # only the cache denies now
        assert time.monotonic() < reset_at + 5, "never admitted after the reset"
        time.sleep(0.05)
        decision = policy.hit(identity)
    admitted_at = time.monotonic()
    assert not decision.local
    assert admitted_at - reset_at <= 1.0 + SLACK
    assert admitted_at - before <= 1.0 + SLACK


def test_live_overrides_set_in_a_real_other_process(other_process: OtherProcess) -> None:
    """A block set elsewhere refuses this process's next decision; an allow set elsewhere
    admits a flood this process answers locally within 1 s of the denial, like a reset; a clear
    ends the allow at the next decision."""
    policy = get_policy("login")
    other_process.reset("block", "login", "192.0.2.1")
    blocked = policy.hit("192.0.2.1")
    assert not blocked.allowed and blocked.override == "block" and not blocked.local
    for _ in range(policy.limit):
        assert policy.hit("192.0.2.2").allowed
    before = time.monotonic()
    assert not policy.hit("192.0.2.2").local
    allowed_at = other_process.reset("allow", "login", "192.0.2.2")
    decision = policy.hit("192.0.2.2")
    while not decision.allowed:
        assert decision.local, decision  # only this process's cache, for under a second
        assert time.monotonic() < allowed_at + 5, "never admitted after the allow"
        time.sleep(0.05)
        decision = policy.hit("192.0.2.2")
    assert decision.override == "allow"
    assert time.monotonic() - before <= 1.0 + SLACK
    other_process.reset("clear", "login", "192.0.2.2")
    after = policy.hit("192.0.2.2")
    assert not after.allowed and after.override is None  # its own count again, at once


# -- 3. a reset in this process forgets at once -----------------------------------------------

def test_policy_reset_forgets_at_once_and_only_its_own_entry() -> None:
    policy = Policy("mine", rate="2/m")
    deny_then_local(policy, "a", now=T)
    deny_then_local(policy, "b", now=T)
    assert policy.reset("a")
    again = hit(policy, "a", now=T + 1)
    assert again.allowed and not again.local
    assert hit(policy, "b", now=T + 1).local  # another identity's denial stands


def test_inspect_reset_key_forgets_at_once() -> None:
    policy = Policy("admin-reset", rate="1/h", algorithm="gcra")
    deny_then_local(policy, "a", now=T)
    assert reset_key(policy.redis_key("a"))
    assert policy.redis_key("a") not in denials._entries
    again = hit(policy, "a", now=T + 1)
    assert again.allowed and not again.local


def test_the_reset_command_forgets_at_once() -> None:
    policy = get_policy("login")
    deny_then_local(policy, "203.0.113.5", now=T)
    out = StringIO()
    call_command("redislua_reset", "login", "203.0.113.5", stdout=out, stderr=StringIO())
    assert "reset rl:login:" in out.getvalue()
    again = hit(policy, "203.0.113.5", now=T + 1)
    assert again.allowed and not again.local


async def test_areset_forgets_at_once() -> None:
    policy = Policy("async-reset", rate="1/m", algorithm="sliding_log")
    assert (await policy.ahit("a")).allowed
    denied = await policy.ahit("a")
    assert not denied.allowed and not denied.local
    assert (await policy.ahit("a")).local
    assert await policy.areset("a")
    again = await policy.ahit("a")
    assert again.allowed and not again.local


# -- 4. racing threads: the cache never over-admits ---------------------------------------------

THREADS, ROUNDS, PER_ROUND = 64, 4, 5


@pytest.mark.parametrize(("algorithm", "rate"), [
    ("sliding_window", "10/m"),
    ("sliding_log", "10/m"),
    ("fixed_window", "10/d"),  # a day: the test cannot straddle two windows
    ("token_bucket", "10/h"),  # an hour: nothing refills meanwhile
    ("leaky_bucket", "10/h"),
    ("gcra", "10/h"),
])
def test_racing_threads_admit_exactly_the_limit(algorithm: str, rate: str) -> None:
    policy = Policy("flood", rate=rate, algorithm=algorithm)
    policy.peek("warm-up")  # load the script
    barrier = threading.Barrier(THREADS)

    def flood() -> list[Decision]:
        out = []
        for _ in range(ROUNDS):
            barrier.wait(timeout=60)
            out += [policy.hit("one-ip") for _ in range(PER_ROUND)]
        return out

    with ThreadPoolExecutor(THREADS) as pool:
        futures = [pool.submit(flood) for _ in range(THREADS)]
        decisions = [d for future in futures for d in future.result(timeout=120)]
    assert len(decisions) == THREADS * ROUNDS * PER_ROUND
    assert sum(d.allowed for d in decisions) == 10
    local = [d for d in decisions if d.local]
    assert len(local) > len(decisions) // 2, len(local)  # the cache answered most of the flood
    assert all(not d.allowed and d.remaining == 0 and d.retry_after > 0 for d in local)
    denials.forget()
    assert not policy.hit("one-ip").allowed  # Redis itself holds the limit as spent


# -- 5. concurrency policies are never cached ----------------------------------------------------

def test_concurrency_denials_are_never_cached(recorder: CommandRecorder) -> None:
    policy = Policy("c", algorithm="concurrency", limit=1)
    held = policy.hit("u")
    assert held.allowed and held.lease is not None
    with recorder:
        denied = [policy.hit("u") for _ in range(3)]
    assert all(not d.allowed and not d.local for d in denied)
    assert recorder.commands.count("EVALSHA") == 3  # each one asked Redis
    assert policy.redis_key("u") not in denials._entries
    policy.release("u", held)
    again = policy.hit("u")
    assert again.allowed and not again.local  # admitted the moment the slot was freed
    policy.release("u", again)

    # Within a multi-policy call too.
    rate = Policy("r", rate="100/m")
    held = policy.hit("u")
    first, _ = engine.evaluate([(policy, "u", 1), (rate, "u", 1)])
    assert not first.allowed and not first.local
    assert policy.redis_key("u") not in denials._entries
    policy.release("u", held)
    slot, _ = engine.evaluate([(policy, "u", 1), (rate, "u", 1)])
    assert slot.allowed and slot.lease is not None


# -- 6. through Django: a local 429 is the 429 Redis gave ----------------------------------------

RATELIMIT = re.compile(r'^"(?P<name>[^"]+)";r=(?P<r>\d+);t=(?P<t>\d+)$')


@pytest.mark.django_db
def test_a_local_429_carries_the_headers_of_redis_429(
    client: Client, recorder: CommandRecorder
) -> None:
    seen: list[Decision] = []

    def receiver(sender: Any, request: Any, decision: Decision, **kwargs: Any) -> None:
        seen.append(decision)

    rate_limited.connect(receiver, weak=False)
    try:
        assert [client.get("/rl/inline/").status_code for _ in range(3)] == [200] * 3
        remote = client.get("/rl/inline/")
        with recorder:
            local = client.get("/rl/inline/")
    finally:
        rate_limited.disconnect(receiver)
    assert remote.status_code == local.status_code == 429
    assert recorder.commands == []  # no round trip at all
    assert [d.local for d in seen] == [False, True]  # the signal fires for both
    names = {"Retry-After", "RateLimit", "RateLimit-Policy"}
    assert names <= set(remote.headers) and names <= set(local.headers)
    assert {h for h in local.headers if "ratelimit" in h.lower()} == {
        h for h in remote.headers if "ratelimit" in h.lower()}
    assert local["RateLimit-Policy"] == remote["RateLimit-Policy"]
    assert ";q=3;w=60" in local["RateLimit-Policy"]
    there, here = RATELIMIT.match(remote["RateLimit"]), RATELIMIT.match(local["RateLimit"])
    assert there is not None and here is not None, (remote["RateLimit"], local["RateLimit"])
    assert here["name"] == there["name"] and here["r"] == there["r"] == "0"
    assert int(there["t"]) - 1 <= int(here["t"]) <= int(there["t"])
    wait = int(local["Retry-After"])
    assert wait >= 1 and int(remote["Retry-After"]) - 1 <= wait <= int(remote["Retry-After"])


@pytest.mark.django_db
def test_a_stacked_view_flood_consumes_nothing_from_the_wider_policies(client: Client) -> None:
    """The narrow policy denies locally; the wide one (gating too) must not be spent."""
    codes = [client.get("/rl/stacked/").status_code for _ in range(12)]
    assert codes == [200, 200] + [429] * 10
    last = client.get("/rl/stacked/")
    items = dict(item.split(";", 1) for item in last["RateLimit"].split(", "))
    assert items['"stack-narrow"'].startswith("r=0;")
    assert items['"stack-wide"'].startswith("r=3;")  # 5/m, spent by the two admitted only


def test_a_local_denial_of_one_gating_policy_spends_nothing_from_the_others(
    recorder: CommandRecorder
) -> None:
    narrow, wide = Policy("narrow", rate="1/m"), Policy("wide", rate="10/m")
    soft = Policy("soft", rate="100/m")
    checks = [(narrow, "u", 1), (wide, "u", 1), (soft, "u", 1)]
    assert all(engine.evaluate(checks, soft={2}))
    second = engine.evaluate(checks, soft={2})
    assert not second[0].allowed and not second[0].local
    flood = [engine.evaluate(checks, soft={2}) for _ in range(20)]
    assert all(d[0].local and not d[0].allowed for d in flood)
    assert peek(wide, "u").remaining == 9  # only the first request spent it
    assert peek(soft, "u").remaining == 100 - 22  # a soft policy is spent whenever it allows
    # Every gating check denied here: no round trip at all.
    deny_then_local(wide, "v")
    deny_then_local(narrow, "v")
    with recorder:
        both = engine.evaluate([(narrow, "v", 1), (wide, "v", 1)])
    assert all(d.local and not d.allowed for d in both)
    assert "EVALSHA" not in recorder.commands


@override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {"anon": "1/m"}})
def test_a_drf_throttle_answers_a_flood_locally_with_the_same_wait(
    recorder: CommandRecorder
) -> None:
    view = drf_view(drf.AnonRateThrottle)
    assert drf_call(view).status_code == 200
    remote = drf_call(view)
    with recorder:
        local = drf_call(view)
    assert remote.status_code == local.status_code == 429
    assert "EVALSHA" not in recorder.commands
    wait = int(local["Retry-After"])
    assert wait >= 1 and int(remote["Retry-After"]) - 1 <= wait <= int(remote["Retry-After"])
    assert local["RateLimit-Policy"] == remote["RateLimit-Policy"]


# -- 7. an entry belongs to the rate that made it -------------------------------------------------

def tiered(request: object) -> str:
    return "1/m"


@pytest.mark.parametrize(("old", "new"), [
    (Policy("plan", rate="1/m"), Policy("plan", rate="5/m")),  # a higher rate
    (Policy("plan", rate="1/m"), Policy("plan", rate="1/s")),  # the same count, shorter period
    (Policy("plan", rate="5/m"), Policy("plan", rate="1/m")),  # a lower one: Redis decides
    (Policy("plan", rate="1/m", algorithm="gcra", burst=1),
     Policy("plan", rate="1/m", algorithm="gcra", burst=4)),  # a larger burst
    (Policy("plan", rate="2/m", algorithm="token_bucket"),
     Policy("plan", rate="4/2m", algorithm="token_bucket")),  # same limit, another interval
    (Policy("plan", rate=tiered).with_rate("1/m"), Policy("plan", rate=tiered).with_rate("3/m")),
], ids=["higher", "shorter", "lower", "burst", "interval", "with_rate"])
def test_an_entry_made_under_another_rate_asks_redis(old: Policy, new: Policy) -> None:
    assert old.redis_key("u") == new.redis_key("u")
    deny_then_local(old, "u", now=T)
    decision = hit(new, "u", now=T + 1)
    assert not decision.local
    if new.limit > old.limit:
        assert decision.allowed
    # And the old rate's entry is still whatever Redis says, not a stale shortcut.
    assert hit(old, "u", now=T + 2).allowed == peek(old, "u", now=T + 2).allowed


# -- 8. LOCAL_DENY: off, a settings change, E024 -----------------------------------------------

def test_local_deny_off_sends_every_denial_to_redis(recorder: CommandRecorder) -> None:
    policy = Policy("off", rate="1/m")
    with redislua(LOCAL_DENY=False):
        assert policy.hit("u").allowed
        with recorder:
            denied = [policy.hit("u") for _ in range(5)]
        assert all(not d.allowed and not d.local for d in denied)
        assert recorder.commands.count("EVALSHA") == 5
        assert denials._entries == {}
    # On again (the default): the next denial is remembered, the one after is local.
    assert not policy.hit("u").local
    assert policy.hit("u").local


def test_a_settings_change_clears_the_cache() -> None:
    policy = Policy("change", rate="1/m")
    deny_then_local(policy, "u")
    with redislua():
        assert denials._entries == {}
        assert not policy.hit("u").local


@pytest.mark.parametrize("value", ["no", "False", 0, 1, None, [True]])
def test_e024_local_deny_not_a_bool(value: object) -> None:
    with redislua(LOCAL_DENY=value):
        assert "redislua.E024" in [m.id for m in check_settings()]
        with pytest.raises(SystemCheckError, match=r"redislua\.E024"):
            call_command("check", stdout=StringIO(), stderr=StringIO())


@pytest.mark.parametrize("value", [True, False])
def test_e024_not_for_a_bool(value: bool) -> None:
    with redislua(LOCAL_DENY=value):
        assert "redislua.E024" not in [m.id for m in check_settings()]


# -- 9. bounded -----------------------------------------------------------------------------------

def test_the_cache_never_holds_more_than_max_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(denials, "MAX_ENTRIES", 50)
    policy = Policy("many", rate="1/m")
    sizes = []
    for i in range(120):
        assert hit(policy, f"id{i}", now=T).allowed
        assert not hit(policy, f"id{i}", now=T).allowed
        sizes.append(len(denials._entries))
    assert max(sizes) == 50  # it filled up, and never beyond
    # An identity dropped from a full cache is denied by Redis again, never admitted.
    dropped = [i for i in range(120) if policy.redis_key(f"id{i}") not in denials._entries]
    assert dropped
    again = hit(policy, f"id{dropped[0]}", now=T + 1)
    assert not again.allowed and not again.local


def test_a_full_cache_drops_expired_entries_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(denials, "MAX_ENTRIES", 50)
    policy = Policy("aging", rate="1/m")
    for name, now, n in [("old", T, 30), ("new", T + 2 * US, 20)]:
        for i in range(n):
            assert hit(policy, f"{name}{i}", now=now).allowed
            assert not hit(policy, f"{name}{i}", now=now).allowed
    assert len(denials._entries) == 50
    assert hit(policy, "last", now=T + 2 * US).allowed
    assert not hit(policy, "last", now=T + 2 * US).allowed  # full: the 30 expired ones go
    assert len(denials._entries) == 21
    assert all(hit(policy, f"new{i}", now=T + 2 * US + 1).local for i in range(20))


# -- 10. asyncio ------------------------------------------------------------------------------

async def test_an_async_flood_is_answered_locally(recorder: CommandRecorder) -> None:
    policy = Policy("aflood", rate="2/m", algorithm="gcra")
    other = Policy("aflood-2", rate="1/m")
    first = [await policy.ahit("u") for _ in range(3)]
    assert [d.allowed for d in first] == [True, True, False] and not first[2].local
    assert (await other.ahit("u")).allowed
    assert not (await other.ahit("u")).local
    with recorder:
        flood = await asyncio.gather(*(policy.ahit("u") for _ in range(50)))
        both = await engine.aevaluate([(policy, "u", 1), (other, "u", 1)])
    assert all(d.local and not d.allowed for d in flood)
    assert all(0 < d.retry_after <= first[2].retry_after for d in flood)
    assert all(d.local and not d.allowed for d in both)
    assert "EVALSHA" not in recorder.commands
    redis_says = await policy.apeek("u")  # peeks go to Redis: it agrees
    assert not redis_says.allowed


# -- two clocks: a denial on injected time never outlives its wait on the local clock ----------


def test_a_denial_on_an_injected_wall_clock_does_not_outlive_its_wait() -> None:
    policy = Policy("mixed", rate="1/m")
    wall = round(time.time() * US)  # what a DRF throttle with its own timer passes
    assert hit(policy, "u", now=wall).allowed
    assert not hit(policy, "u", now=wall).allowed
    decision = hit(policy, "u")  # the same key, no injected time: the local clock
    assert not decision.allowed
    assert decision.retry_after <= peek(policy, "u").retry_after + 1
    # The other way round: an entry on the local clock, requests at injected times.
    assert hit(policy, "v").allowed
    assert not hit(policy, "v").allowed
    assert hit(policy, "v").local
    assert not hit(policy, "v", now=wall).local
    assert not hit(policy, "v", now=1_000_000_000).local  # a test's small frozen clock


@pytest.mark.parametrize("step_s", [-10, -1, 1, 3600])
def test_a_step_of_the_wall_clock_never_stretches_a_local_answer(
        step_s: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache's clock is this process's wall clock (a suspended machine's monotonic clock
    would stop): stepped back or forward past its 1 s, an entry asks Redis again."""
    policy = Policy("stepped", rate="1/m")
    assert hit(policy, "u").allowed
    assert not hit(policy, "u").allowed
    assert hit(policy, "u").local
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + round(step_s * 1e9))
    asked = hit(policy, "u")
    assert not asked.local and not asked.allowed  # Redis's clock did not step: still denied


def drf_view(throttle: type[Any]) -> Any:
    class View(APIView):
        throttle_classes = [throttle]
        authentication_classes: list[Any] = []

        def get(self, request: Request) -> Response:
            return Response({"ok": True})

    return View.as_view()


def drf_call(view: Any) -> Any:
    request = APIRequestFactory().get("/", REMOTE_ADDR="10.0.0.1")
    force_authenticate(request, user=None)
    return view(request)


@override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {"anon": "1/m"}})
def test_a_drf_throttle_with_its_own_timer_does_not_poison_the_default_one() -> None:
    timed = type("WallClockAnon", (drf.AnonRateThrottle,), {"timer": lambda self: time.time()})
    assert drf_call(drf_view(timed)).status_code == 200
    assert drf_call(drf_view(timed)).status_code == 429
    response = drf_call(drf_view(drf.AnonRateThrottle))  # the same scope, the same address
    assert response.status_code == 429
    assert int(response["Retry-After"]) <= 60
