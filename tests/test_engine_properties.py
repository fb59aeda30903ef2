"""Property tests: random sequences through the Lua engine on real Redis and through the
pure-Python reference models (tests/reference_models.py) must agree on every Decision field.

Time is injected (``evaluate(..., now_us=...)``), so no test sleeps. Keys written by the engine
expire in *real* time, which injected time does not follow; so each script call runs inside
MULTI/EXEC together with PTTL (checked against the TTL the model says the state needs) and
PERSIST, which keeps the state for the next injected step. The Lua must then behave on state
older than its TTL exactly as on a missing key, which the models assume. A call that keeps the
key's expiry (a window's hit in place) leaves it persisted: the expiry in force is then the one
the write that set it derived, carried in injected time (``expires_at``), and must equal what
the model says the state needs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_redislua.connection import get_client
from django_redislua.limiting import Decision, Policy, denials, evaluate
from tests import reference_models as ref
from tests.transactional import TransactionalClient

BASE_US = 1_700_000_000_000_000
ALGORITHMS = list(ref.MODELS)
PERIODS_S = (1, 7, 60)
# REDISLUA_PROPERTY_EXAMPLES=500 for a deeper hunt than the quick default.
PROPERTY_SETTINGS = settings(
    max_examples=int(os.environ.get("REDISLUA_PROPERTY_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def make_policy(name: str, algorithm: str, count: int, period_s: int, burst: int | None) -> Policy:
    if algorithm == "concurrency":
        return Policy(name, algorithm=algorithm, limit=count, timeout=period_s)
    if algorithm in ("token_bucket", "leaky_bucket", "gcra"):
        return Policy(name, rate=f"{count}/{period_s}s", algorithm=algorithm, burst=burst)
    return Policy(name, rate=f"{count}/{period_s}s", algorithm=algorithm)


@st.composite
def policies(draw: st.DrawFn, name: str, algorithm: str) -> Policy:
    count = draw(st.integers(1, 6))
    burst = draw(st.none() | st.integers(1, 6))
    return make_policy(name, algorithm, count, draw(st.sampled_from(PERIODS_S)), burst)


def steps(period_us: int) -> st.SearchStrategy[int]:
    return st.one_of(
        st.just(0),
        st.integers(1, 2_000),
        st.integers(0, period_us),
        st.integers(period_us, 3 * period_us),
    )


def snapshot(client: redis.Redis, keys: Sequence[str]) -> list[tuple[Any, int]]:
    pipe = client.pipeline(transaction=False)  # one round trip: the test's CPU goes there
    for key in keys:
        pipe.dump(key)
        pipe.pttl(key)
    replies = pipe.execute()
    return list(zip(replies[::2], replies[1::2], strict=True))


def model_for(policy: Policy) -> ref.Model:
    return ref.MODELS[policy.algorithm](policy.limit, policy.param, int(policy.extra or 1))


def assert_agree(decision: Decision, outcome: ref.Outcome, policy: Policy) -> None:
    if decision.local:
        # The local denial cache answered: Redis (the model) denies too, with the same wait and
        # reset; the quota it reported can only have grown since (a bucket refilling part of a
        # cost above 1), never shrunk (this process is the only one consuming here).
        assert (decision.allowed, decision.reset_after, decision.retry_after) == (
            outcome.allowed, outcome.reset_after_us / 1e6, outcome.retry_after_us / 1e6)
        assert 0 <= decision.remaining <= outcome.remaining
        assert decision.limit == policy.limit and decision.policy is policy
        return
    assert (decision.allowed, decision.remaining, decision.reset_after, decision.retry_after) == (
        outcome.allowed,
        outcome.remaining,
        outcome.reset_after_us / 1e6,
        outcome.retry_after_us / 1e6,
    )
    assert decision.limit == policy.limit
    assert decision.policy is policy
    assert decision.remaining >= 0
    if decision.allowed:
        assert decision.retry_after == 0.0
    else:
        assert decision.retry_after > 0.0


def expected_pttl_ms(ttl_us: int) -> int:
    return max(1, math.ceil(ttl_us / 1000))


def run_step(
    client: redis.Redis,
    tx: TransactionalClient,
    checks: list[tuple[Policy, ref.Model, str, int]],
    now: int,
    peek: bool,
    soft: frozenset[int] = frozenset(),
) -> list[Decision]:
    """One evaluate through Redis and the models; asserts agreement, TTLs and no-write rules."""
    keys = [policy.redis_key(identity) for policy, _m, identity, _c in checks]
    before = snapshot(client, keys)
    decisions = evaluate(
        [(policy, identity, cost) for policy, _m, identity, cost in checks],
        peek=peek, now_us=now, client=tx, soft=soft,  # type: ignore[arg-type]
    )
    outcomes, ttls = ref.evaluate(
        [(model, key, cost, d.lease or "")
         for (_p, model, _i, cost), key, d in zip(checks, keys, decisions, strict=True)],
        now,
        peek=peek,
        soft=soft,
    )
    for (policy, *_rest), decision, outcome in zip(checks, decisions, outcomes, strict=True):
        assert_agree(decision, outcome, policy)
    gates = all(d.allowed for i, d in enumerate(decisions) if i not in soft)
    for i, (key, ttl_us, before_i) in enumerate(zip(keys, ttls, before, strict=True)):
        committed = ttl_us is not None
        assert committed == (not peek and decisions[i].allowed and (i in soft or gates))
        assert (decisions[i].lease is not None) == (committed and checks[i][0].code == "cc")
        if committed and tx.pttls[key] == -1:
            # The call kept the expiry in force (a window's hit in place, after the PERSIST that
            # follows every call): the one the write that set it derived, which, carried to this
            # injected time, must be the TTL the state needs now, to the microsecond.
            assert tx.expires_at.get(key) == now + ttl_us
        elif committed:
            # PTTL is read in the same transaction, but a loaded machine can stall the server
            # between commands; the upper bound is the exact one.
            assert expected_pttl_ms(ttl_us) - 250 <= tx.pttls[key] <= expected_pttl_ms(ttl_us)
            tx.expires_at[key] = now + ttl_us
        else:
            # peek, or denied (by itself, or by a gating policy): nothing written, TTL untouched.
            assert snapshot(client, [key]) == [before_i]
    return decisions


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@PROPERTY_SETTINGS
@given(data=st.data())
def test_single_policy_matches_model(algorithm: str, data: st.DataObject) -> None:
    client = get_client()
    assert isinstance(client, redis.Redis)
    client.flushall()
    denials.forget()
    tx = TransactionalClient(client)
    policy = data.draw(policies("prop", algorithm))
    model = model_for(policy)
    period_us = policy.param if algorithm == "concurrency" else policy.rate.period_us  # type: ignore[union-attr]
    cost_max = 1 if algorithm == "concurrency" else policy.limit
    # The run is drawn whole, with strategies built once (a data.draw per value built and
    # validated a strategy each time): (step, identity, action, cost).
    now = BASE_US + data.draw(st.integers(0, period_us))
    count = data.draw(st.integers(1, 20))  # as many as drawn (a list's own sizes run short)
    hits = data.draw(st.lists(
        st.tuples(steps(period_us), st.sampled_from(["alice", "bob"]),
                  st.sampled_from(["hit", "hit", "peek", "release"]), st.integers(1, cost_max)),
        min_size=count, max_size=count))
    held: list[tuple[str, Decision]] = []
    for step, identity, action, cost in hits:
        now += step
        if action == "release":
            if algorithm == "concurrency" and held:
                released_identity, decision = held.pop(data.draw(st.integers(0, len(held) - 1)))
                policy.release(released_identity, decision)
                assert isinstance(model, ref.Concurrency)
                model.release(policy.redis_key(released_identity), decision.lease or "")
            continue
        [decision] = run_step(client, tx, [(policy, model, identity, cost)], now, action == "peek")
        if decision.lease is not None:
            held.append((identity, decision))
        if not decision.allowed:
            # A lone caller's retry_after is the true wait: it succeeds then, not 1 us sooner.
            retry_us = round(decision.retry_after * 1e6)
            check = [(policy, model, identity, cost)]
            [later] = run_step(client, tx, check, now + retry_us, True)
            assert later.allowed
            [sooner] = run_step(client, tx, check, now + retry_us - 1, True)
            assert not sooner.allowed


ALGORITHM_MIXES = st.lists(st.sampled_from(ALGORITHMS), min_size=2, max_size=3)


@PROPERTY_SETTINGS
@given(data=st.data(), algorithms=ALGORITHM_MIXES)
def test_multi_policy_gates_match_model(data: st.DataObject, algorithms: list[str]) -> None:
    """Gating policies all-or-nothing among themselves; soft ones (block=False) on their own."""
    client = get_client()
    assert isinstance(client, redis.Redis)
    client.flushall()
    denials.forget()
    tx = TransactionalClient(client)
    chosen = [data.draw(policies(f"mix{i}", algorithm)) for i, algorithm in enumerate(algorithms)]
    models = [model_for(p) for p in chosen]
    soft = frozenset(i for i in range(len(chosen)) if data.draw(st.booleans()))
    cost_max = 1 if "concurrency" in algorithms else min(p.limit for p in chosen)
    now = BASE_US + data.draw(st.integers(0, 60_000_000))
    count = data.draw(st.integers(1, 20))  # drawn whole, as in the single-policy test
    hits = data.draw(st.lists(
        st.tuples(steps(7_000_000), st.sampled_from(["u1", "u2"]), st.integers(1, cost_max),
                  st.booleans()),
        min_size=count, max_size=count))
    for step, identity, cost, peek in hits:
        now += step
        checks = [(p, m, identity, cost) for p, m in zip(chosen, models, strict=True)]
        run_step(client, tx, checks, now, peek, soft)


LARGE_RATES = st.tuples(st.integers(1, 10**7), st.sampled_from((1, 7, 3600, 86_400)))


@PROPERTY_SETTINGS
@given(data=st.data())
def test_a_sliding_log_whose_limit_changes_keeps_every_entry(data: st.DataObject) -> None:
    """One identity decided at limits on both sides of 128 (a rate callable's tiers): the log
    moves between its two forms (7-byte entries up to 128, a sorted set above) at admitted
    hits, and every decision agrees with the one model log."""
    base = Policy("tiers", rate="6/60s", algorithm="sliding_log")
    limits = data.draw(st.lists(st.sampled_from((2, 6, 127, 128, 129, 300)), min_size=2,
                                max_size=3, unique=True))
    tiers = [base.with_rate(f"{limit}/60s") for limit in limits]
    models = [model_for(tier) for tier in tiers]
    for model in models[1:]:
        model.state = models[0].state  # one log, whatever the limit it is read at
    client = get_client()
    assert isinstance(client, redis.Redis)
    client.flushall()
    denials.forget()
    tx = TransactionalClient(client)
    now = BASE_US + data.draw(st.integers(0, 60_000_000))
    for _ in range(data.draw(st.integers(1, 25))):
        now += data.draw(steps(60_000_000))
        i = data.draw(st.integers(0, len(tiers) - 1))
        cost = data.draw(st.integers(1, min(3, tiers[i].limit)) | st.just(tiers[i].limit))
        run_step(client, tx, [(tiers[i], models[i], "who", cost)], now, data.draw(st.booleans()))


@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if a != "concurrency"])
@PROPERTY_SETTINGS
@given(data=st.data(), rate=LARGE_RATES)
def test_large_magnitudes_match_model(algorithm: str, data: st.DataObject,
                                      rate: tuple[int, int]) -> None:
    """The scripts divide with math.floor / math.ceil on doubles (lib/*.lua): exact only while
    every operand stays below 2^53. Counts up to 10^7 a day, bursts near what redislua.E007
    allows, costs up to the whole limit, on a clock of 1.7e15 us: the script still agrees with
    the integer model to the microsecond."""
    count, period_s = rate
    burst = None
    if algorithm in ("token_bucket", "leaky_bucket", "gcra"):
        probe = Policy("big", rate=f"{count}/{period_s}s", algorithm=algorithm, burst=1)
        largest = max(1, (2**53 // 4) // probe.param)
        burst = data.draw(st.integers(max(1, largest - 1000), largest) | st.integers(1, largest))
    policy = make_policy("big", algorithm, count, period_s, burst)
    client = get_client()
    assert isinstance(client, redis.Redis)
    client.flushall()
    denials.forget()
    tx = TransactionalClient(client)
    model = model_for(policy)
    period_us = period_s * 1_000_000
    now = BASE_US + data.draw(st.integers(0, period_us))
    # (sliding_log stores one entry per unit of cost: no cost of 10^7 there)
    top = policy.limit if algorithm != "sliding_log" else min(3, policy.limit)
    for _ in range(data.draw(st.integers(1, 12))):
        now += data.draw(steps(period_us))
        cost = data.draw(st.integers(1, top) | st.just(top))
        run_step(client, tx, [(policy, model, "who", cost)], now, data.draw(st.booleans()))


@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if a != "concurrency"])
@PROPERTY_SETTINGS
@given(data=st.data())
def test_single_and_multi_policy_scripts_clamp_alike(algorithm: str, data: st.DataObject) -> None:
    """One clamping rule for both scripts (lib/clamp.lua): on random states, a peek through the
    algorithm's own script and through ratelimit.lua (the same check beside another) answer the
    same Decision, including with a limit lowered below what was already used, where the
    remaining quota would be negative."""
    client = get_client()
    assert isinstance(client, redis.Redis)
    client.flushall()
    denials.forget()
    tx = TransactionalClient(client)
    period_s = data.draw(st.sampled_from(PERIODS_S))
    high = make_policy("clamp", algorithm, data.draw(st.integers(2, 9)), period_s, None)
    low = high.with_rate(f"{data.draw(st.integers(1, high.limit - 1))}/{period_s}s")
    other = Policy("clamp-other", rate="9/m", algorithm="fixed_window")
    now = BASE_US
    for _ in range(data.draw(st.integers(1, 8))):
        now += data.draw(steps(period_s * 1_000_000))
        evaluate([(high, "who", data.draw(st.integers(1, high.limit)))], now_us=now,
                 client=tx)  # type: ignore[arg-type]
    now += data.draw(st.integers(0, 2_000))
    probe = data.draw(st.sampled_from([high, low]))
    cost = data.draw(st.integers(1, probe.limit))
    single = evaluate([(probe, "who", cost)], peek=True, now_us=now,
                      client=tx)[0]  # type: ignore[arg-type]
    multi = evaluate([(probe, "who", cost), (other, "elsewhere", 1)], peek=True, now_us=now,
                     client=tx)[0]  # type: ignore[arg-type]
    assert single[:5] == multi[:5]  # allowed, limit, remaining, reset_after, retry_after
    assert single.remaining >= 0
