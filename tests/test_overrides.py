"""Live overrides (django_redislua.overrides) against real Redis: block, allow and a changed
rate decided inside the decision's own script, single and multi-policy, EVALSHA and Functions,
single server and cluster; expiry on the decisions' clock; the local denial cache; hostile
values; one command per decision."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import redis
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st
from redis.cluster import RedisCluster

from django_redislua import Policy, overrides
from django_redislua.connection import get_client, primary_nodes
from django_redislua.limiting import clock, denials, evaluate
from django_redislua.limiting.decision import ALLOW, BLOCK, RATE
from django_redislua.limiting.definition import overrides_key
from django_redislua.testing import CommandRecorder
from tests import reference_models as ref
from tests import test_engine_properties as properties
from tests.test_engine_properties import PROPERTY_SETTINGS
from tests.transactional import TransactionalClient

pytestmark = pytest.mark.topologies

ALGORITHMS = ["fixed_window", "sliding_log", "sliding_window", "token_bucket", "leaky_bucket",
              "gcra", "concurrency"]


def make(algorithm: str, name: str = "api", rate: str = "2/h") -> Policy:
    if algorithm == "concurrency":
        return Policy(name, algorithm=algorithm, limit=2, timeout="10m")
    return Policy(name, rate=rate, algorithm=algorithm)


@pytest.fixture(params=["evalsha", "functions"])
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    from tests.settings import REDISLUA  # the topology fixture may have changed it

    with override_settings(REDISLUA={**REDISLUA, "USE_FUNCTIONS": request.param == "functions"}):
        yield request.param


@pytest.fixture(autouse=True)
def _clock_back() -> Iterator[None]:
    yield
    clock.reset()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_block_refuses_without_consuming_for_its_remaining_time(algorithm: str,
                                                                    mode: str) -> None:
    policy = make(algorithm)
    assert policy.hit("u").allowed
    overrides.block(policy, "u", ttl="1h", reason="stuffing")
    denied = policy.hit("u")
    assert (denied.allowed, denied.override, denied.remaining) == (False, BLOCK, 0)
    assert 3590 < denied.retry_after <= 3600
    assert policy.hit("other").allowed  # only that identity
    assert overrides.clear(policy, "u")
    after = policy.hit("u")
    assert after.allowed and after.override is None
    assert after.remaining == 0  # two of two: the blocked hits consumed nothing


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_an_allow_admits_past_the_limit_without_consuming(algorithm: str, mode: str) -> None:
    policy = make(algorithm)
    overrides.allow(policy, "partner", ttl="30d", reason="partner")
    for _ in range(5):
        decision = policy.hit("partner")
        assert (decision.allowed, decision.override, decision.remaining) == (True, ALLOW, 2)
        assert decision.lease is None  # nothing taken, nothing to give back
    overrides.clear(policy, "partner")
    assert policy.hit("partner").remaining == 1  # the full quota was left


@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if a != "concurrency"])
def test_a_changed_rate_decides_at_that_rate_on_the_identitys_state(algorithm: str,
                                                                     mode: str) -> None:
    policy = make(algorithm)
    overrides.set_rate(policy, "plan", "5/h", ttl="1d", reason="enterprise")
    decisions = [policy.hit("plan") for _ in range(6)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False]
    assert {d.limit for d in decisions} == {5} and {d.override for d in decisions} == {RATE}
    overrides.clear(policy, "plan")
    back = policy.hit("plan")
    assert not back.allowed and back.limit == 2  # the state carried over: no fresh quota


def test_a_changed_rate_of_a_concurrency_policy_changes_its_slots(mode: str) -> None:
    policy = make("concurrency")
    overrides.set_rate(policy, "big", "4", ttl="1h")
    held = [policy.hit("big") for _ in range(5)]
    assert [d.allowed for d in held] == [True] * 4 + [False]
    for decision in held[:4]:
        policy.release("big", decision)
    assert policy.hit("big").allowed


def test_every_policy_and_the_policys_own_override_winning(mode: str) -> None:
    login, api = make("gcra", "login"), make("sliding_window", "api")
    overrides.block("*", "203.0.113.7", ttl="10m", reason="everywhere")
    assert not login.hit("203.0.113.7").allowed and not api.hit("203.0.113.7").allowed
    overrides.allow(api, "203.0.113.7", ttl="10m")  # its own override wins over "*"
    assert api.hit("203.0.113.7").override == ALLOW
    assert login.hit("203.0.113.7").override == BLOCK
    assert overrides.clear("*", "203.0.113.7")
    assert login.hit("203.0.113.7").allowed


def test_several_policies_in_one_call(mode: str) -> None:
    """A block on a gating policy refuses the request: the others consume nothing; a soft
    policy's allow admits it alone."""
    strict, loose = make("fixed_window", "strict"), make("token_bucket", "loose")
    overrides.block(strict, "u", ttl="1h")
    first = evaluate([(strict, "u", 1), (loose, "u", 1)])
    assert [(d.allowed, d.override) for d in first] == [(False, BLOCK), (True, None)]
    overrides.clear(strict, "u")
    second = evaluate([(strict, "u", 1), (loose, "u", 1)])
    assert [d.remaining for d in second] == [1, 1]  # the blocked call consumed nothing
    overrides.set_rate(loose, "u", "10/h", ttl="1h")
    third = evaluate([(strict, "u", 1), (loose, "u", 1)])
    assert [(d.limit, d.override) for d in third] == [(2, None), (10, RATE)]


def test_an_override_ends_on_the_decisions_clock() -> None:
    policy = make("fixed_window", rate="1/d")
    assert policy.hit("u").allowed
    overrides.allow(policy, "u", ttl="1h")
    assert policy.hit("u").allowed
    found = overrides.get(policy, "u")
    assert found is not None and found.kind == ALLOW
    clock.advance(3601)  # the testing helpers' advance(): decisions and overrides alike
    assert overrides.get(policy, "u") is None
    assert not policy.hit("u").allowed  # the day's quota is back in charge


def test_a_decision_is_one_command_with_or_without_an_override(r: redis.Redis,
                                                               mode: str) -> None:
    policy = make("gcra")
    policy.hit("warm")
    overrides.block(policy, "u", ttl="1h")
    with CommandRecorder(r) as recorder:
        assert not policy.hit("u").allowed
        assert policy.hit("v").allowed
    assert recorder.commands == ["FCALL" if mode == "functions" else "EVALSHA"] * 2


def test_this_process_forgets_a_local_denial_at_once() -> None:
    policy = make("fixed_window", rate="1/h")
    policy.hit("u")
    assert not policy.hit("u").allowed
    assert policy.hit("u").local  # the flood is answered here now
    overrides.allow(policy, "u", ttl="1m")
    assert policy.hit("u").allowed
    overrides.clear(policy, "u")
    overrides.block(policy, "u", ttl="1m")
    blocked = policy.hit("u")
    assert blocked.override == BLOCK and not blocked.local
    again = policy.hit("u")
    assert again.local and again.override == BLOCK  # a blocked flood costs no round trip


def test_get_and_scan_read_what_was_set(mode: str) -> None:
    policy = make("sliding_log")
    made = overrides.set_rate(policy, "k1", "9/h", ttl="2h", reason="plan <b>", by="ops")
    overrides.block("*", "k2", ttl="5m", reason="abuse")
    found = overrides.get(policy, "k1")
    assert found is not None
    assert (found.kind, found.rate, found.reason, found.created_by, found.identity) == \
        (RATE, "9/h", "plan <b>", "ops", "k1")
    assert found.expires_at == made.expires_at
    assert overrides.get(policy, "k2") is None  # only its own field: "*" is get("*", ...)
    assert overrides.get("*", "k2") is not None
    listed = sorted((o.policy, o.identity, o.kind) for o in overrides.scan())
    assert listed == [("*", "k2", BLOCK), ("api", "k1", RATE)]
    assert [o.identity for o in overrides.scan(policy="*")] == ["k2"]
    assert not overrides.clear(policy, "nobody")


def test_hostile_values_make_bounded_keys_and_records(r: redis.Redis) -> None:
    policy = make("fixed_window")
    identity = "{" + "x\n<script>" * 100_000 + "}"
    made = overrides.block(policy, identity, ttl="1m", reason="r" * 1_000_000, by="b" * 10_000)
    assert len(made.reason) == overrides.MAX_REASON and len(made.identity) == overrides.MAX_SHOWN
    assert not policy.hit(identity).allowed
    key = policy.redis_keys(identity)[1]
    assert len(key) < 80
    node = r.get_redis_connection(r.get_node_from_key(key)) if hasattr(r, "get_node_from_key") \
        else r
    assert node.memory_usage(key) < 4096


def test_mistakes_are_named() -> None:
    policy = make("gcra")
    with pytest.raises(ValueError, match='"\\*" has no rate'):
        overrides.set_rate("*", "u", "5/m", ttl="1h")
    with pytest.raises(ValueError, match="longer than an override may last"):
        overrides.block(policy, "u", ttl="400d")
    with pytest.raises(ValueError, match="duration"):
        overrides.block(policy, "u", ttl="forever")
    with pytest.raises(ValueError, match="rate"):
        overrides.set_rate(policy, "u", "lots", ttl="1h")
    with pytest.raises(KeyError):
        overrides.block("no-such-policy", "u", ttl="1h")


def test_redis_failing_raises_override_unavailable() -> None:
    from tests.settings import REDISLUA

    down = {**REDISLUA, "CONNECTION": "redis://127.0.0.1:1/0", "SOCKET_CONNECT_TIMEOUT": 0.2}
    with override_settings(REDISLUA=down), pytest.raises(overrides.OverrideUnavailable):
        overrides.block(make("gcra"), "u", ttl="1h")


async def test_the_asyncio_twins(mode: str) -> None:
    policy = make("token_bucket")
    await overrides.ablock(policy, "u", ttl="1h")
    assert (await policy.ahit("u")).override == BLOCK
    assert (await overrides.aget(policy, "u")) is not None
    assert await overrides.aclear(policy, "u")
    await overrides.aallow(policy, "u", ttl="1h")
    assert (await policy.ahit("u")).override == ALLOW
    await overrides.aset_rate(policy, "u", "7/h", ttl="1h")
    assert (await policy.ahit("u")).limit == 7


def test_the_override_key_shares_the_identitys_slot() -> None:
    from redis.crc import key_slot

    policy = make("gcra")
    state, override = policy.redis_keys("user:42")
    assert override == overrides_key("user:42")
    assert key_slot(state.encode()) == key_slot(override.encode())



def test_decisions_are_counted_as_blocked_and_allowed_by_override() -> None:
    from prometheus_client import REGISTRY

    def count(result: str) -> float:
        labels = {"policy": "counted", "algorithm": "gcra", "result": result}
        return REGISTRY.get_sample_value("redislua_decisions_total", labels) or 0.0

    policy = make("gcra", "counted")
    before = {result: count(result) for result in ("blocked", "allowed_by_override", "denied")}
    overrides.block(policy, "u", ttl="1m")
    assert policy.hit("u").override == BLOCK
    assert policy.hit("u").local  # answered here, still a block
    overrides.allow(policy, "v", ttl="1m")
    policy.hit("v")
    assert count("blocked") - before["blocked"] == 2
    assert count("allowed_by_override") - before["allowed_by_override"] == 1
    assert count("denied") == before["denied"]


def test_the_management_command_runs_an_incident() -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command

    from django_redislua.limiting.registry import get_policy

    def command(*args: str) -> str:
        out = StringIO()
        call_command("redislua_override", *args, stdout=out)
        return out.getvalue()

    login = get_policy("login")
    said = command("block", "login", "203.0.113.7", "--ttl", "1h", "--reason", "stuffing")
    assert "login '203.0.113.7': block until" in said and "stuffing" in said
    assert login.hit("203.0.113.7").override == BLOCK
    # "api" keys by user_or_ip: user 42 is "u42" (issue 35: "42" was stored and never matched)
    with pytest.raises(CommandError, match="write 'u42' for user 42"):
        command("rate", "api", "42", "500/m", "--ttl", "30d")
    assert "rate 500/m" in command("rate", "api", "u42", "500/m", "--ttl", "30d")
    rerated = get_policy("api").hit("u42")  # gcra, burst 20: the burst is kept, the rate is new
    assert (rerated.override, rerated.limit) == (RATE, 20)
    listed = command("list")
    assert "login '203.0.113.7': block" in listed and "api 'u42': rate 500/m" in listed
    assert "cleared" in command("clear", "login", "203.0.113.7")
    assert login.hit("203.0.113.7").override is None
    assert "no override to clear" in command("clear", "login", "203.0.113.7")
    found = overrides.get("api", "u42")
    assert found is not None and (found.created_by or "").startswith("manage.py (")
    for wrong, message in ((("block", "nope", "x", "--ttl", "1h"), "no policy named 'nope'"),
                           (("block", "login", "x", "--ttl", "ever"), "duration"),
                           (("rate", "*", "x", "5/m", "--ttl", "1h"), "has no rate"),
                           (("rate", "api", "x", "lots", "--ttl", "1h"), "not a rate")):
        with pytest.raises(CommandError, match=message):
            command(*wrong)


def test_a_shadow_policys_block_is_what_it_would_have_done() -> None:
    from prometheus_client import REGISTRY

    shadow = Policy("shadowed", rate="5/m", algorithm="gcra", mode="shadow")
    labels = {"policy": "shadowed", "algorithm": "gcra", "result": "shadow_denied"}
    before = REGISTRY.get_sample_value("redislua_decisions_total", labels) or 0.0
    overrides.block(shadow, "u", ttl="1m")
    decision = shadow.hit("u")
    assert (decision.allowed, decision.override, decision.shadow) == (False, BLOCK, True)
    assert REGISTRY.get_sample_value("redislua_decisions_total", labels) == before + 1


# -- against the reference models, injected time ---------------------------------------------

@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if a != "concurrency"])
@pytest.mark.parametrize("functions", [False, True], ids=["evalsha", "functions"])
def test_decisions_overrides_and_resets_match_the_model(algorithm: str, functions: bool,
                                                        topology: str) -> None:
    """Random hits, peeks, blocks, allows, changed rates, clears, expiries and resets, through
    Redis and through the reference model plus a model of the overrides, agree on every
    Decision field."""
    from tests.settings import REDISLUA

    # The settings change once per test, not per example: each change builds a new client
    # (on a cluster, its discovery took a third of this test's time).
    with override_settings(REDISLUA={**REDISLUA, "USE_FUNCTIONS": functions}):
        run_overrides_model(algorithm)


@PROPERTY_SETTINGS
@given(data=st.data())
def run_overrides_model(algorithm: str, data: st.DataObject) -> None:
    """One example of the test above, under its settings."""
    client = get_client()
    for _name, node in primary_nodes(client):
        node.flushall()
    denials.forget()
    tx = TransactionalClient(client)
    policy = data.draw(properties.policies("ovm", algorithm))
    models = {"base": properties.model_for(policy)}
    period_us = policy.rate.period_us  # type: ignore[union-attr]
    now = properties.BASE_US + data.draw(st.integers(0, period_us))
    table: dict[tuple[str, str], tuple[str, int, Policy | None]] = {}

    def live(identity: str) -> tuple[str, int, Policy | None] | None:
        for field in (policy.name, "*"):
            found = table.get((field, identity))
            if found is not None and now < found[1]:
                return found
        return None

    # The run is drawn whole, with strategies built once (a data.draw per value built and
    # validated a strategy each time); each step carries every value an action may use.
    length = data.draw(st.integers(1, 25))  # as many as drawn (a list's sizes run short)
    run = data.draw(st.lists(st.tuples(
        properties.steps(period_us), st.sampled_from(["alice", "bob"]),
        st.sampled_from(
            ["hit", "hit", "hit", "peek", "block", "allow", "rate", "clear", "reset"]),
        st.sampled_from([policy.name, "*"]), st.integers(1_000, 3 * period_us),
        st.integers(1, 6), st.integers(1, policy.limit)), min_size=length, max_size=length))
    for step, identity, action, drawn_field, ttl_us, count, cost in run:
        now += step
        key = policy.redis_key(identity)
        if action in ("block", "allow", "rate"):
            field = drawn_field if action != "rate" else policy.name
            target = policy if field == policy.name else "*"
            if action == "rate":
                rated = policy.with_rate(f"{count}/{period_us // 1_000_000}s")
                made = overrides.set_rate(policy, identity, rated.rate_spec, ttl=ttl_us / 1e6,
                                          now_us=now)
                table[(field, identity)] = ("r", now + ttl_us, rated)
            else:
                made = getattr(overrides, action)(target, identity, ttl=ttl_us / 1e6,
                                                  now_us=now)
                table[(field, identity)] = (action[0], now + ttl_us, None)
            assert made.expires_at.timestamp() == pytest.approx((now + ttl_us) / 1e6)
            hash_key = policy.redis_keys(identity)[1]  # real time must not expire it
            owner = client.get_redis_connection(client.get_node_from_key(hash_key)) \
                if isinstance(client, RedisCluster) else client
            owner.persist(hash_key)
            continue
        if action == "clear":
            field = drawn_field
            had = table.pop((field, identity), None) is not None
            assert overrides.clear(policy if field == policy.name else "*", identity) == had
            continue
        if action == "reset":
            policy.reset(identity)
            for model in models.values():
                model.state.pop(key, None)
            continue
        [decision] = evaluate([(policy, identity, cost)], peek=action == "peek", now_us=now,
                              client=tx)
        found = live(identity)
        if found is not None and found[0] in ("b", "a"):
            if decision.local:  # a denial this process knew before the block: still denied
                assert found[0] == "b" and not decision.allowed
                continue
            ends = found[1]
            expected = (False, 0, ends - now, ends - now) if found[0] == "b" \
                else (True, policy.limit, 0, 0)
            assert decision.override == ("block" if found[0] == "b" else "allow")
            assert (decision.allowed, decision.remaining, round(decision.reset_after * 1e6),
                    round(decision.retry_after * 1e6)) == expected
            continue
        rated = found[2] if found is not None else None
        model = models["base"]
        limit = policy.limit
        if rated is not None:  # the changed rate's model on the same state
            model = properties.model_for(rated)
            model.state = models["base"].state
            limit = rated.limit
        if cost > limit and decision.local:  # a denial known here answers it: denied too
            assert not decision.allowed
            continue
        if cost > limit:  # above the changed rate's capacity: no wait admits it
            assert (decision.allowed, decision.remaining, decision.retry_after) == \
                (False, limit, math.inf)
            continue
        outcomes, _ttls = ref.evaluate([(model, key, cost, "")], now, peek=action == "peek")
        outcome = outcomes[0]
        assert decision.override == (None if rated is None else "rate")
        assert decision.limit == limit
        if decision.local:
            assert not outcome.allowed
            assert round(decision.retry_after * 1e6) == outcome.retry_after_us
            continue
        assert (decision.allowed, decision.remaining, round(decision.reset_after * 1e6),
                round(decision.retry_after * 1e6)) == (
            outcome.allowed, outcome.remaining, outcome.reset_after_us, outcome.retry_after_us)


def test_a_blocked_request_is_a_429_for_the_blocks_time_and_the_signal_says_so() -> None:
    from django.http import HttpRequest, HttpResponse
    from django.test import RequestFactory

    from django_redislua.decorators import ratelimit
    from django_redislua.signals import rate_limited

    @ratelimit("api")
    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    seen = []

    def receiver(sender: object, request: HttpRequest, decision: object, **kwargs: object) -> None:
        seen.append(decision)

    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.77")
    assert view(request).status_code == 200
    overrides.block("api", "192.0.2.77", ttl="20m", reason="abuse")
    rate_limited.connect(receiver)
    try:
        response = view(RequestFactory().get("/", REMOTE_ADDR="192.0.2.77"))
    finally:
        rate_limited.disconnect(receiver)
    assert response.status_code == 429
    assert 1190 <= int(response["Retry-After"]) <= 1200
    assert [d.override for d in seen] == [BLOCK]  # type: ignore[attr-defined]
