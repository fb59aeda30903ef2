"""Refunds (``count_failures``, issue 35) against real Redis with injected time: what a hit took,
given back by ratelimit_refund.lua, compared with the reference models (tests/reference_models.py)
fed only the hits that were not given back ("had the hit never happened").

The promises: after a refund the budget left is the model's without the hit, exactly, at once;
its expiry is the model's too for the windows (the fixed window's, when the refunded hit opened
it while others followed, ends later by at most the time since the hit: never earlier), and
for the buckets never earlier (a hit's cost is given back only as far as the hit still weighs);
every stored form of every algorithm is read and written back; a refund of a hit whose window
ended, or under another rate, changes nothing; a refund sent twice gives back once.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
import redis
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st

from django_redislua import Decision, Policy, overrides
from django_redislua.limiting import denials, evaluate
from django_redislua.limiting.inspect import log_times, unpack_state
from django_redislua.limiting.refund import Refund, give_back, refunds_of
from django_redislua.testing import CommandRecorder
from tests import reference_models as ref
from tests.settings import REDISLUA
from tests.test_engine_properties import PROPERTY_SETTINGS, make_policy
from tests.transactional import TransactionalClient

T = 1_700_000_040_000_000  # a whole minute of the server clock, us (a sliding window's start)
S = 1_000_000
MINUTE = 60 * S
WINDOWS = ("fixed_window", "sliding_window", "sliding_log")
BUCKETS = ("token_bucket", "leaky_bucket", "gcra")
REFUNDABLE = WINDOWS + BUCKETS
WHO = "alice"


def make(algorithm: str, rate: str = "5/m", name: str = "login", **options: Any) -> Policy:
    return Policy(name, rate=rate, algorithm=algorithm, key="post:username",
                  count_failures=[401], **options)


def hit(policy: Policy, now: int, cost: int = 1, client: Any = None, who: str = WHO
        ) -> Decision:
    decision = evaluate([(policy, who, cost)], now_us=now, client=client)[0]
    assert decision.allowed and decision.consumed == cost
    return decision


def peek(policy: Policy, now: int, client: Any = None, who: str = WHO) -> Decision:
    return evaluate([(policy, who, 1)], now_us=now, peek=True, client=client)[0]


def refund(decision: Decision, hit_at: int, now: int, client: Any = None) -> bool:
    """Give back ``decision``'s hit, made at ``hit_at``, at ``now`` (so the time the app
    measured between them is exactly the server's)."""
    return give_back([Refund(decision, received=hit_at)], now_us=now, client=client)[0]


def model_of(policy: Policy, hits: list[tuple[int, int]]) -> ref.Model:
    """The reference model of ``policy`` after ``hits`` ((time, cost), each admitted)."""
    model = ref.MODELS[policy.algorithm](policy.limit, policy.param, int(policy.extra or 1))
    for at, cost in hits:
        pending = model.check("k", at, cost)
        assert pending.allowed, f"the model refuses a hit Redis admitted at {at - T}"
        pending.commit()
    return model


def model_peek(model: ref.Model, now: int) -> tuple[int, int]:
    remaining, reset, _retry = model.check("k", now, 1).report(False)
    return max(0, remaining), max(0, reset)


def seen(decision: Decision) -> tuple[int, int]:
    return decision.remaining, round(decision.reset_after * S)


# -- exactly what the hit took ---------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", REFUNDABLE)
@pytest.mark.parametrize(("k", "j"), [(1, 1), (3, 1), (5, 2), (5, 5)])
def test_k_hits_then_j_refunds_leave_what_k_minus_j_hits_leave(
    algorithm: str, k: int, j: int, r: redis.Redis
) -> None:
    """The newest j of k hits, a second apart, given back half a second after the last (each
    refund measuring its own hit's age): the state is the model's of the first k - j hits,
    the budget left and the reset time alike, now and as it ages."""
    policy = make(algorithm)
    hits = [(T + i * S, hit(policy, T + i * S)) for i in range(k)]
    now = T + k * S + S // 2
    given = give_back([Refund(d, received=at) for at, d in reversed(hits[k - j:])], now_us=now)
    assert given == [True] * j
    model = model_of(policy, [(at, 1) for at, _d in hits[:k - j]])
    for later in (now, now + 10 * S, T + MINUTE + S // 2, T + 2 * MINUTE + 1):
        assert seen(peek(policy, later)) == model_peek(model, later), (later - T) / S
    if j == k:
        assert not r.exists(policy.redis_key(WHO))  # emptied: deleted, not kept at zero


@pytest.mark.parametrize("algorithm", REFUNDABLE)
def test_a_refund_gives_back_one_hit_however_many_units_were_left(
    algorithm: str, r: redis.Redis
) -> None:
    """A hit of cost 3 is given back whole, and only it: the others stay counted."""
    policy = make(algorithm, rate="10/m")
    first = hit(policy, T, cost=2)
    big = hit(policy, T + S, cost=3)
    assert refund(big, T + S, T + 2 * S)
    model = model_of(policy, [(T, 2)])
    assert seen(peek(policy, T + 2 * S)) == model_peek(model, T + 2 * S)
    assert refund(first, T, T + 3 * S)
    assert peek(policy, T + 3 * S).remaining == 10
    assert not r.exists(policy.redis_key(WHO))


def test_the_sliding_window_finds_a_hit_of_the_previous_window(r: redis.Redis) -> None:
    """A hit near a window's end, refunded in the next window after another hit moved its
    count to "previous": that count is the one given back (the hit's offset in its window is
    exact from its reset_after)."""
    policy = make("sliding_window", rate="4/m")
    early = hit(policy, T + 59 * S)
    hit(policy, T + MINUTE + S)
    assert refund(early, T + 59 * S, T + MINUTE + 2 * S)
    model = model_of(policy, [(T + MINUTE + S, 1)])
    for later in (T + MINUTE + 2 * S, T + MINUTE + 30 * S, T + 2 * MINUTE + 1):
        assert seen(peek(policy, later)) == model_peek(model, later)


def test_the_fixed_window_restarts_when_its_opener_is_given_back(r: redis.Redis) -> None:
    """The refunded hit opened the window and another followed: the count is exact at once,
    and the window ends late by at most the time since the refunded hit, never early."""
    policy = make("fixed_window", rate="3/m")
    opener = hit(policy, T)
    hit(policy, T + 2 * S)
    assert refund(opener, T, T + 5 * S)
    truth = model_of(policy, [(T + 2 * S, 1)])  # its window opened at T + 2 s
    assert seen(peek(policy, T + 5 * S)) == (2, 60 * S)  # the count exact; ends at T + 65 s
    assert model_peek(truth, T + 5 * S) == (2, 57 * S)
    assert peek(policy, T + 65 * S).remaining == 3
    assert r.pttl(policy.redis_key(WHO)) > 0


@pytest.mark.parametrize("algorithm", BUCKETS)
def test_a_bucket_gives_back_no_more_than_the_hit_still_weighs(
    algorithm: str, r: redis.Redis
) -> None:
    """From a full bucket, a hit at T drains for 30 s, then another hit: given back at T + 31 s,
    the first hit weighed only what had not drained when the second came, which the refund
    cannot know: it gives back less, never more (the state stays between the model with both
    hits and the model without the first)."""
    policy = make(algorithm, rate="2/m", burst=2)  # an interval of 30 s
    first = hit(policy, T)
    hit(policy, T + 20 * S)
    assert refund(first, T, T + 21 * S)
    both = model_of(policy, [(T, 1), (T + 20 * S, 1)])
    without = model_of(policy, [(T + 20 * S, 1)])
    for later in (T + 21 * S, T + 45 * S, T + 52 * S, T + 80 * S):
        remaining, reset = seen(peek(policy, later))
        assert model_peek(both, later)[0] <= remaining <= model_peek(without, later)[0]
        assert model_peek(without, later)[1] <= reset <= model_peek(both, later)[1]


# -- every stored form -----------------------------------------------------------------------------
def widened(r: redis.Redis, policy: Policy) -> int:
    """Rewrite the state in the previous release's form (doubles, which every script still
    reads), numbers unchanged; its length."""
    key = policy.redis_key(WHO)
    value, ttl = r.get(key), r.pttl(key)
    assert value is not None
    fields = unpack_state(policy.code, value)
    assert fields is not None
    wide = struct.pack("<" + "d" * len(fields), *(float(v) for _n, v in fields))
    r.set(key, wide, px=ttl if ttl > 0 else None)  # (a TransactionalClient's keys persist)
    return len(wide)


FORMS = [
    # (algorithm, rate, burst, costs of the hits before the refunded one, widen, state length)
    ("fixed_window", "5/m", None, (1,), False, 19),
    ("fixed_window", "5000/h", None, (1000,), False, 12),
    ("fixed_window", "2000000000000/d", None, (2**40 + 5,), False, 16),
    ("fixed_window", "5/m", None, (1,), True, 16),
    ("sliding_window", "5/m", None, (1,), False, 19),
    ("sliding_window", "5000/h", None, (1000,), False, 12),
    ("sliding_window", "20000000/m", None, (2**24 + 3,), False, 24),
    ("sliding_window", "5/m", None, (1,), True, 24),
    ("token_bucket", "5/m", None, (1,), False, 12),
    ("token_bucket", "1009/s", None, (700,), False, 24),
    ("token_bucket", "5/m", None, (1,), True, 24),
    ("leaky_bucket", "5/m", None, (1,), False, 12),
    ("leaky_bucket", "1/d", 20, (18,), False, 16),
    ("leaky_bucket", "5/m", None, (1,), True, 16),
    ("gcra", "5/m", None, (1,), False, 12),
    ("gcra", "5/m", None, (1,), True, 16),
]


@pytest.mark.parametrize(("algorithm", "rate", "burst", "before", "widen", "length"), FORMS,
                         ids=[f"{f[0]}-{f[5]}{'-widened' if f[4] else ''}" for f in FORMS])
def test_every_stored_form_is_given_back_in_its_own_form(
    algorithm: str, rate: str, burst: int | None, before: tuple[int, ...], widen: bool,
    length: int, r: redis.Redis,
) -> None:
    options = {"burst": burst} if burst else {}
    policy = Policy("forms", rate=rate, algorithm=algorithm, count_failures=True, **options)
    key = policy.redis_key(WHO)
    tx = TransactionalClient(r)  # a 1009/s bucket's state lives 1 ms in real time: kept
    times = [T + 123 + 5_000 * i for i in range(len(before) + 1)]
    for at, cost in zip(times, before, strict=False):
        hit(policy, at, cost, client=tx)
    last = hit(policy, times[-1], client=tx)
    if widen:
        assert widened(r, policy) == length
    assert r.strlen(key) == length
    now = times[-1] + 1_000
    assert refund(last, times[-1], now, client=tx)
    if algorithm in WINDOWS:
        assert r.strlen(key) == length  # in place (a bucket is written as a decision writes)
    model = model_of(policy, list(zip(times, before, strict=False)))
    assert seen(peek(policy, now, client=tx)) == model_peek(model, now)


def test_the_sliding_log_forms(r: redis.Redis) -> None:
    """The 7-byte log (a limit up to 128), the sorted set (above), and the previous release's
    sorted set of nonce members under a small limit: one entry of the hit removed, the others
    kept in time order."""
    small = make("sliding_log", rate="6/m")
    key = small.redis_key(WHO)
    hit(small, T, cost=2)
    mine = hit(small, T + S)
    hit(small, T + 2 * S)
    assert refund(mine, T + S, T + 3 * S)
    assert log_times(r.get(key)) == [T, T, T + 2 * S]

    large = make("sliding_log", rate="200/m", name="large")
    key = large.redis_key(WHO)
    hit(large, T, cost=11)  # members "<T>:1" .. "<T>:11"
    mine = hit(large, T)  # "<T>:12", which sorts before "<T>:9"
    hit(large, T + 20)
    assert r.type(key) == b"zset"
    assert refund(mine, T, T + S)
    assert r.zcard(key) == 12 and r.zscore(key, f"{T}:12") is None
    # A hit at that very time numbers its entry from the live count (12): no member of that
    # time is overwritten, since the highest number was the one removed.
    hit(large, T)
    assert r.zcard(key) == 13 and peek(large, T + S).remaining == 200 - 13

    old = make("sliding_log", rate="5/m", name="old")
    key = old.redis_key(WHO)
    r.zadd(key, {f"0123456789abcdef:{i}": T + i for i in range(1, 4)})
    r.pexpire(key, 60_000)
    as_then = Decision(True, 5, 2, 60.0, 0.0, old, WHO, consumed=1)  # the hit at T + 3
    assert refund(as_then, T + 3, T + S)
    assert sorted(int(s) for _m, s in r.zrange(key, 0, -1, withscores=True)) == [T + 1, T + 2]


# -- what a refund never does ----------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", REFUNDABLE)
def test_a_hit_whose_window_ended_is_not_given_back(algorithm: str, r: redis.Redis) -> None:
    """Its window over (a bucket: drained), a hit weighs nothing: giving it back would give
    back another one's. The state a later hit made is left as it is."""
    policy = make(algorithm, rate="3/m")
    old = hit(policy, T)
    later = T + 2 * MINUTE + S
    hit(policy, later)
    before = r.get(policy.redis_key(WHO))
    assert not refund(old, T, later + S)
    assert r.get(policy.redis_key(WHO)) == before
    assert peek(policy, later + S).remaining == 2


@pytest.mark.parametrize("algorithm", REFUNDABLE)
def test_a_refund_sent_twice_gives_back_once(algorithm: str, r: redis.Redis) -> None:
    policy = make(algorithm)
    hit(policy, T)
    mine = Refund(hit(policy, T + S), received=T + S)
    assert give_back([mine], now_us=T + 2 * S) == [True]
    assert give_back([mine], now_us=T + 2 * S) == [False]
    assert peek(policy, T + 2 * S).remaining == 4


class Unreachable:
    """A client whose every command fails, as a dropped connection does."""

    def execute_command(self, *args: Any) -> Any:
        raise redis.ConnectionError("connection reset")


def test_a_refund_whose_call_failed_is_not_sent_again(r: redis.Redis) -> None:
    """The reply lost, the refund may have been applied or not: it is not sent again (a lost
    one counts one failure more, the safe side; twice would give back two)."""
    policy = make("sliding_log")
    mine = Refund(hit(policy, T), received=T)
    with pytest.raises(redis.ConnectionError):
        give_back([mine], now_us=T + S, client=Unreachable())
    assert mine.sent
    assert give_back([mine], now_us=T + S) == [False]
    assert peek(policy, T + S).remaining == 4


def test_a_rate_changed_since_the_hit_gives_nothing_back(r: redis.Redis) -> None:
    """A live override that changed the rate after the hit (or ended since): the refund is
    not made under other numbers. Under the same override, it is."""
    policy = make("gcra")
    plain = hit(policy, T)
    overrides.set_rate(policy, WHO, "10/m", ttl="1h", now_us=T + S)
    assert not refund(plain, T, T + 2 * S)
    without = peek(policy, T + 4 * S)
    changed = hit(policy, T + 3 * S)
    assert changed.limit == 10 and changed.override == "rate"
    assert refund(changed, T + 3 * S, T + 4 * S)
    assert seen(peek(policy, T + 4 * S)) == seen(without)


def test_a_decision_says_what_it_consumed(r: redis.Redis) -> None:
    """Decision.consumed: the cost a hit took, 0 when it took nothing (a denial, a peek, a
    gating check another denied, an override's block or allow); a soft check's own."""
    one = make("sliding_log", rate="2/m")
    assert evaluate([(one, WHO, 2)], now_us=T)[0].consumed == 2
    assert evaluate([(one, WHO, 1)], now_us=T)[0].consumed == 0  # denied
    assert evaluate([(one, "bob", 1)], now_us=T, peek=True)[0].consumed == 0
    roomy = make("gcra", rate="5/m", name="roomy")
    gate = evaluate([(roomy, WHO, 1), (one, WHO, 1)], now_us=T)
    assert [d.consumed for d in gate] == [0, 0]  # all-or-nothing: the denial closed the gate
    soft = evaluate([(roomy, WHO, 3), (one, WHO, 1)], now_us=T, soft={0})
    assert [d.consumed for d in soft] == [3, 0]
    overrides.allow(one, "carol", ttl="1h", now_us=T)
    assert evaluate([(one, "carol", 1)], now_us=T)[0].consumed == 0
    assert evaluate([(roomy, "carol", 1), (one, "carol", 1)], now_us=T)[1].consumed == 0
    overrides.set_rate(one, "dave", "10/m", ttl="1h", now_us=T)
    assert evaluate([(one, "dave", 2)], now_us=T)[0].consumed == 2  # at the changed rate
    assert [d.consumed for d in evaluate([(roomy, "dave", 1), (one, "dave", 2)],
                                         now_us=T)] == [1, 2]


def test_only_consumed_hits_of_count_failures_policies_are_refundable() -> None:
    counted = make("sliding_log")
    every = Policy("every", rate="5/m", algorithm="sliding_log")
    admitted = Decision(True, 5, 4, 60.0, 0.0, counted, WHO, consumed=1)
    denied = Decision(False, 5, 0, 60.0, 3.0, counted, WHO)
    other = Decision(True, 5, 4, 60.0, 0.0, every, WHO, consumed=1)
    refunds = refunds_of([admitted, denied, other, admitted])  # merged rules share a Decision
    assert [refund.decision for refund in refunds] == [admitted]


@pytest.mark.topologies
def test_refunds_of_several_identities_go_in_one_round_trip(r: Any) -> None:
    """One call per refund, written together (on a cluster, one write per node)."""
    policy = make("sliding_window")
    refunds = [Refund(hit(policy, T, who=who), received=T) for who in ("alice", "bob", "carol")]
    assert give_back(refunds, now_us=T + S) == [True, True, True]
    assert [peek(policy, T + S, who=who).remaining for who in ("alice", "bob", "carol")] == [5] * 3


@pytest.mark.parametrize("algorithm", REFUNDABLE)
def test_a_refund_as_a_redis_function(algorithm: str, r: redis.Redis,
                                      recorder: CommandRecorder) -> None:
    """With USE_FUNCTIONS the refund is an FCALL of the library, like every script."""
    policy = make(algorithm)
    with override_settings(REDISLUA={**REDISLUA, "USE_FUNCTIONS": True}):
        hit(policy, T)
        mine = Refund(hit(policy, T + S), received=T + S)
        with recorder:
            assert give_back([mine], now_us=T + 2 * S) == [True]
        assert recorder.commands == ["FCALL"]
        assert peek(policy, T + 2 * S).remaining == 4


# -- a random history ------------------------------------------------------------------------------
def forced(policy: Policy, hits: list[tuple[int, int]]) -> ref.Model:
    """The model of ``policy`` with every one of ``hits`` counted, admitted or not."""
    model = ref.MODELS[policy.algorithm](policy.limit, policy.param, int(policy.extra or 1))
    for at, cost in hits:
        model.check("k", at, cost).commit()
    return model


@PROPERTY_SETTINGS
@given(data=st.data())
@pytest.mark.parametrize("algorithm", ["sliding_window", "sliding_log", *BUCKETS])
def test_a_random_history_of_hits_and_refunds(algorithm: str, data: st.DataObject,
                                              r: redis.Redis) -> None:
    """Hits at random times and costs, some given back a random "view time" later (under a
    quarter period), interleaved: for the windows, every hit Redis admits the model without
    the refunded hits admits too, and at the end and as time passes the budget left is that
    model's, exactly. For the buckets, between what it would be with no refund at all and
    that model's a little later: a hit drained while another request overlapped it weighs
    less than its cost, by at most the time the requests took. (Not the fixed
    window: which hit opens a window decides where every later window falls, so a history
    without some hits is not comparable window by window; the tests above check it.)"""
    r.flushall()  # (the examples share the test's server)
    denials.forget()
    tx = TransactionalClient(r)
    count = data.draw(st.integers(1, 6))
    period_s = data.draw(st.sampled_from((1, 7, 60)))
    burst = data.draw(st.none() | st.integers(1, 6)) if algorithm in BUCKETS else None
    policy = make_policy("prop", algorithm, count, period_s, burst)
    period = period_s * S
    now = T + data.draw(st.integers(0, period))
    events: list[tuple[int, int, int]] = []  # (time, order, hit index): refunds after their hit
    for i in range(data.draw(st.integers(1, 10))):
        now += data.draw(st.sampled_from((0, 1)) | st.integers(1, 2_000) | st.integers(0, period))
        events.append((now, 2 * i, i))
    refunded: set[int] = set()
    took = 0  # the time the refunded requests took, together
    for at, _order, i in list(events):
        if data.draw(st.booleans()):
            refunded.add(i)
            view = data.draw(st.integers(0, period // 4))
            took += view
            events.append((at + view, 2 * i + 1, i))
    kept: list[tuple[int, int]] = []
    every: list[tuple[int, int]] = []
    admitted: dict[int, tuple[int, Decision]] = {}
    for at, order, i in sorted(events):
        if order % 2:
            if i in admitted:
                hit_at, decision = admitted[i]
                give_back([Refund(decision, received=hit_at)], now_us=at, client=tx)
            continue
        cost = data.draw(st.integers(1, policy.limit))
        decision = evaluate([(policy, WHO, cost)], now_us=at, client=tx)[0]
        if not decision.allowed:
            continue
        every.append((at, cost))
        if i in refunded:
            admitted[i] = (at, decision)
        else:
            kept.append((at, cost))
            if algorithm not in BUCKETS:
                model_of(policy, kept)  # the model without the refunded hits admits it too
    end = max(at for at, _o, _i in events)
    without, with_all = forced(policy, kept), forced(policy, every)
    for later in (end, end + period // 2, end + period + 1, end + 2 * period):
        remaining, reset = seen(peek(policy, later, client=tx))
        if algorithm in BUCKETS:
            # Never below no refund at all; above the model without the refunded hits by no
            # more than those requests took (a hit that drained while another overlapped it).
            assert model_peek(with_all, later)[0] <= remaining
            assert remaining <= model_peek(without, later + took)[0]
            assert model_peek(without, later)[1] - took <= reset <= model_peek(with_all, later)[1]
        else:
            assert (remaining, reset) == model_peek(without, later)
