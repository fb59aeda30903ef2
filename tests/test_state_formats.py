"""How rate-limit state is stored: 12 bytes per identity on the O(1) algorithms (a value Redis keeps
inside its object), 7 bytes per entry on the sliding log; the previous release's forms still read
(docs/algorithms.md, "What an identity costs in Redis"); values that do not fit the compact form
stay exact in the wide one."""

from __future__ import annotations

import struct
import time
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from django_redislua import Policy, overrides
from django_redislua.limiting import evaluate
from django_redislua.limiting.identity import is_bound
from django_redislua.limiting.inspect import log_times, unpack_state
from tests.allocator import exact_sizes
from tests.transactional import TransactionalClient
from tests.unit.test_inspect_state import FOREIGN

pytestmark = pytest.mark.topologies

T = 1_700_000_000_000_000  # an instant on the server clock, us (a whole minute)
MINUTE = 60_000_000
O1 = ("fixed_window", "sliding_window", "token_bucket", "leaky_bucket", "gcra")


def hit(policy: Policy, now: int, cost: int = 1, key: str = "10.0.0.1",
        client: Any = None) -> tuple[bool, int]:
    decision = evaluate([(policy, key, cost)], now_us=now, client=client)[0]
    return decision.allowed, decision.remaining


def peek(policy: Policy, now: int, key: str = "10.0.0.1", client: Any = None) -> int:
    return evaluate([(policy, key, 1)], now_us=now, peek=True, client=client)[0].remaining


@pytest.mark.parametrize("algorithm", O1)
def test_an_identity_costs_one_small_value(algorithm: str, r: redis.Redis) -> None:
    """The windows' state is one 19-digit integer (no allocation of its own: Redis keeps it in
    the object's pointer), the buckets' 12 bytes (inside the object's allocation)."""
    policy = Policy("api", rate="100/h", algorithm=algorithm)
    key = policy.redis_key("10.0.0.1")
    for hits in (1, 9):
        for _ in range(hits):
            policy.hit("10.0.0.1")
        if algorithm in ("fixed_window", "sliding_window"):
            assert r.object("encoding", key) == b"int" and r.strlen(key) == 19
        else:
            assert r.object("encoding", key) == b"embstr" and r.strlen(key) == 12
    fields = unpack_state(policy.code, r.get(key))
    assert fields is not None and all(v.isdigit() for _n, v in fields)
    if algorithm in ("fixed_window", "sliding_window"):
        assert fields[1][1] == "10"  # the count (the current window's)


def test_the_sliding_log_is_seven_bytes_per_entry_in_time_order(r: redis.Redis) -> None:
    policy = Policy("api", rate="5/m", algorithm="sliding_log")
    key = policy.redis_key("10.0.0.1")
    assert hit(policy, T) == (True, 4)
    assert hit(policy, T + 10_000_000, cost=2) == (True, 2)
    assert r.strlen(key) == 21
    # The clock goes back 4 s (a failover to a replica behind): the entry goes in its place.
    assert hit(policy, T + 6_000_000) == (True, 1)
    assert log_times(r.get(key)) == [T, T + 6_000_000, T + 10_000_000, T + 10_000_000]
    denied = evaluate([(policy, "10.0.0.1", 2)], now_us=T + 11_000_000)[0]
    assert not denied.allowed
    # Room for 2 (of 5, 4 used) once the oldest entry has aged out: at T + 60 s.
    assert denied.retry_after == pytest.approx((T + MINUTE - T - 11_000_000) / 1e6)
    # Entries age out: a minute after the first, it is dropped by the next hit.
    assert hit(policy, T + MINUTE + 1) == (True, 1)
    assert log_times(r.get(key)) == [T + 6_000_000, T + 10_000_000, T + 10_000_000,
                                     T + MINUTE + 1]


# The previous release's state, as its scripts wrote it (struct of doubles), and what the next
# decision must make of it.
PREVIOUS = {
    # start, count: 3 of 5 used in the window that started at T
    "fixed_window": (struct.pack("<dd", T, 3), 2),
    # window start, current count, previous count: 2 now, 4 in the last (whole) window, at
    # T + 30 s the estimate is 4 * 1/2 + 2 = 4 of 5
    "sliding_window": (struct.pack("<ddd", T, 2, 4), 1),
    # tokens taken, refilled at (a, b): 4 of 5 taken at T, one refilled every 12 s
    "token_bucket": (struct.pack("<ddd", 4, T, 0), 3),
    # water (1/q us), measured at: 4 intervals of 12 s poured at T
    "leaky_bucket": (struct.pack("<dd", 4 * 12_000_000, T), 3),
    # TAT (a, b): 4 intervals ahead of T
    "gcra": (struct.pack("<dd", T + 4 * 12_000_000, 0), 3),
}


@pytest.mark.parametrize("algorithm", O1)
def test_the_previous_releases_state_still_reads(algorithm: str, r: redis.Redis) -> None:
    """An upgrade loses no state: the wide form (doubles) is read as it was, and the next
    write is the compact form."""
    policy = Policy("api", rate="5/m", algorithm=algorithm)
    key = policy.redis_key("10.0.0.1")
    value, remaining_at_30s = PREVIOUS[algorithm]
    r.set(key, value, px=120_000)
    now = T + 30_000_000
    assert peek(policy, now) == remaining_at_30s
    assert hit(policy, now) == (True, remaining_at_30s - 1)
    assert r.strlen(key) == (19 if algorithm in ("fixed_window", "sliding_window") else 12)
    assert peek(policy, now) == remaining_at_30s - 1


def test_the_previous_releases_sliding_log_still_reads(r: redis.Redis) -> None:
    """It was a sorted set of nonce members: read as it is; the next admitted hit of a small
    log (a limit up to 128) moves its live entries into the 7-byte form."""
    policy = Policy("api", rate="5/m", algorithm="sliding_log")
    key = policy.redis_key("10.0.0.1")
    r.zadd(key, {f"0123456789abcdef:{i}": T + i for i in range(1, 4)})
    r.zadd(key, {"0123456789abcdef:0": T - MINUTE})  # aged out
    r.pexpire(key, 60_000)
    assert peek(policy, T + 1_000_000) == 2
    assert hit(policy, T + 1_000_000) == (True, 1)
    assert r.type(key) == b"string"
    assert log_times(r.get(key)) == [T + 1, T + 2, T + 3, T + 1_000_000]
    assert hit(policy, T + 2_000_000) == (True, 0)
    assert not evaluate([(policy, "10.0.0.1", 1)], now_us=T + 2_000_000)[0].allowed


@pytest.mark.parametrize("limit", [128, 129])
def test_a_log_takes_the_form_its_limit_calls_for(limit: int, r: redis.Redis) -> None:
    """Up to 128, 7 bytes an entry (rewritten by each hit); above, a sorted set (O(log n) a
    hit). A changed limit moves the live entries over at the next admitted hit, exactly."""
    small = Policy("api", rate="6/m", algorithm="sliding_log")
    other = small.with_rate(f"{limit}/m")
    key = small.redis_key("10.0.0.1")
    for i in range(3):
        assert hit(small, T + i, cost=i + 1)[0]  # 6 entries at T, T + 1 (x2), T + 2 (x3)
    assert r.type(key) == b"string"
    assert hit(other, T + 10, cost=2) == (True, limit - 8)
    assert r.type(key) == (b"string" if limit <= 128 else b"zset")
    if limit > 128:
        assert r.zcard(key) == 8
        assert peek(other, T + 10) == limit - 8
        # back to the small limit: moved into the 7-byte form at its next admitted hit
        assert hit(other.with_rate("20/m"), T + 20) == (True, 11)
    times = log_times(r.get(key))
    assert times[:8] == [T, T + 1, T + 1, T + 2, T + 2, T + 2, T + 10, T + 10]
    # Entries age out: a minute after T + 2, only those after T + 2 are left.
    assert peek(other, T + MINUTE + 2) == limit - 2 - (len(times) - 8)


def test_a_large_log_is_a_sorted_set_and_decides_exactly(r: redis.Redis) -> None:
    policy = Policy("api", rate="1000/m", algorithm="sliding_log")
    key = policy.redis_key("10.0.0.1")
    assert hit(policy, T, cost=600) == (True, 400)
    assert hit(policy, T + 30_000_000, cost=400) == (True, 0)
    assert r.type(key) == b"zset" and r.zcard(key) == 1000
    denied = evaluate([(policy, "10.0.0.1", 500)], now_us=T + 40_000_000)[0]
    assert not denied.allowed and denied.retry_after == pytest.approx(20.0)  # the 600 at T
    assert hit(policy, T + MINUTE + 1, cost=500) == (True, 100)
    assert r.zcard(key) == 900  # the 600 aged out and were dropped


@pytest.mark.parametrize(("algorithm", "rate", "cost", "wide"), [
    # a count of 1000 or more: the 12-byte form
    ("fixed_window", "5000/h", 1000, 12),
    ("sliding_window", "5000/h", 1000, 12),
    # a count of 2^40 or more
    ("fixed_window", "2000000000000/d", 2**40 + 5, 16),
    # a period that is not a whole number of ms
    ("sliding_window", "5/0.0015s", 2, 24),
    # a count of 2^24 or more
    ("sliding_window", "20000000/m", 2**24 + 3, 24),
    # an interval of 10^6/1009 us: 5 ms after the first hit, the refill clock's fraction b
    # is 405 (of 1009)
    ("token_bucket", "1009/s", 700, 24),
])
def test_values_beyond_the_compact_form_stay_exact(
    algorithm: str, rate: str, cost: int, wide: int, r: redis.Redis
) -> None:
    policy = Policy("big", rate=rate, algorithm=algorithm)
    key = policy.redis_key("10.0.0.1")
    # Time is injected, but keys expire in real time: a 1.5 ms period's state lives 3 ms, less
    # than a loaded machine takes to the next call. Each call persists what it wrote, in the
    # same transaction, for the next injected step to read.
    tx = TransactionalClient(r)
    allowed, remaining = hit(policy, T + 123, cost=cost, client=tx)
    assert allowed and remaining == policy.limit - cost
    if algorithm == "token_bucket":
        assert hit(policy, T + 5_123, client=tx) == (True, policy.limit - cost + 5 - 1)
        assert r.strlen(key) == wide
        assert peek(policy, T + 5_123, client=tx) == policy.limit - cost + 5 - 1
        return
    assert r.strlen(key) == wide
    assert peek(policy, T + 123, client=tx) == policy.limit - cost
    assert hit(policy, T + 123, client=tx) == (True, policy.limit - cost - 1)
    fields = unpack_state(policy.code, r.get(key))  # the admin reads every form
    start = T + 123 - (T + 123) % policy.param if algorithm == "sliding_window" else T + 123
    assert fields is not None and fields[0][1] == str(start)
    assert fields[1][1] == str(cost + 1)


def test_a_long_identity_is_a_short_digest(r: redis.Redis) -> None:
    """128 bits of SHA-256 in 22 base64url characters (32 hex digits before: 16 bytes more per
    key). Distinct identities, distinct digests; a digest is a key form (overrides.Tag)."""
    policy = Policy("api", rate="100/h", algorithm="gcra")
    token = "Bearer " + "x" * 200
    key = policy.redis_key(token)
    digest = key[key.index("{") + 1:-1]
    assert len(digest) == 23 and digest[0] == "#"
    assert is_bound(digest) and not is_bound("#" + "0" * 32) and not is_bound(token)
    assert policy.redis_key(token + "y") != key
    # Twice: the first write can reuse the allocation of a longer argument an earlier test's
    # script passed in the same position (Redis's cache of Lua call arguments, see
    # docs/ratelimit.md), 16 bytes more; the second value is allocated for itself.
    policy.hit(token)
    policy.hit(token)
    cluster = 16 if isinstance(r, RedisCluster) else 0
    if exact_sizes(r if not isinstance(r, RedisCluster) else r.get_redis_connection(
            r.get_node_from_key(key))):
        assert r.memory_usage(key, samples=0) <= 104 + cluster  # 120 with the 32-digit digest


# -- a window's hit in place (docs/ratelimit.md, "Changing a rate") ---------------------------
WINDOWS = ("fixed_window", "sliding_window")
SECOND = 1_000_000


def assert_pttl(r: redis.Redis, key: str, ms: int) -> None:
    """The key's TTL is MS as a script just set it (less what real time has passed since)."""
    assert ms - 500 < r.pttl(key) <= ms


@pytest.mark.parametrize("algorithm", WINDOWS)
def test_a_hit_in_the_same_window_adds_in_place_and_keeps_the_expiry(
    algorithm: str, r: redis.Redis
) -> None:
    """Later hits of a window add to the count where it is (no rewrite, nothing formatted): the
    key keeps the TTL its window's first hit set, the window's end, which deriving it again on
    the server's clock would give. Injected time shows which: 30 s later, a rewrite would set
    a TTL 30 s shorter."""
    policy = Policy("api", rate="100/m", algorithm=algorithm)
    key = policy.redis_key("10.0.0.1")
    now = T + SECOND
    assert hit(policy, now) == (True, 99)
    window = now - now % policy.param  # the sliding window's: it expires when the next one ends
    end = now + 60 * SECOND if algorithm == "fixed_window" else window + 120 * SECOND
    assert_pttl(r, key, (end - now) // 1000)
    kept = r.pttl(key)
    assert hit(policy, T + 31 * SECOND, cost=3) == (True, 96)
    assert kept - 1000 < r.pttl(key) <= kept
    assert r.object("encoding", key) == b"int" and r.strlen(key) == 19
    fields = unpack_state(policy.code, r.get(key))
    assert fields is not None and fields[1][1] == "4"
    assert peek(policy, T + 31 * SECOND) == 96


@pytest.mark.parametrize("beside", [False, True], ids=["own-script", "with-another-policy"])
@pytest.mark.parametrize("algorithm", WINDOWS)
def test_a_period_changed_by_a_live_override_rewrites_the_expiry(
    algorithm: str, beside: bool, r: redis.Redis
) -> None:
    """A live override's period is not the one the window's TTL was derived with: its hits
    rewrite the state and the TTL (never in place), and so does the first hit after it ends;
    in place again from the next. Through the algorithm's own script, and through ratelimit.lua
    beside another policy."""
    policy = Policy("api", rate="100/10s", algorithm=algorithm)
    key = policy.redis_key("10.0.0.1")
    fixed = algorithm == "fixed_window"
    companion = [(Policy("companion", rate="1000/s"), "10.0.0.1", 1)] if beside else []

    def hit(policy: Policy, now: int) -> tuple[bool, int]:
        decision = evaluate([(policy, "10.0.0.1", 1), *companion], now_us=now)[0]
        return decision.allowed, decision.remaining

    assert hit(policy, T + SECOND) == (True, 99)  # opens the window at T + 1 s (sliding: T)
    overrides.set_rate(policy, "10.0.0.1", "100/20s", ttl="1h", now_us=T + SECOND)
    assert hit(policy, T + 2 * SECOND) == (True, 98)
    # The window at 20 s: fixed, T + 1 s + 20 s; sliding, T's next window's end, T + 40 s.
    assert_pttl(r, key, 19_000 if fixed else 38_000)
    assert r.strlen(key) == 12  # never the decimal form under a changed rate
    assert overrides.clear(policy, "10.0.0.1")
    assert hit(policy, T + 3 * SECOND) == (True, 97)
    assert_pttl(r, key, 8_000 if fixed else 17_000)  # the policy's own 10 s, derived again
    assert r.strlen(key) == 19
    kept = r.pttl(key)
    assert hit(policy, T + 4 * SECOND) == (True, 96)
    assert kept - 1000 < r.pttl(key) <= kept  # in place


def test_a_sliding_window_the_clock_went_back_into_is_rewritten(r: redis.Redis) -> None:
    """A clock gone back stays in the newest window seen; a hit there derives its TTL from the
    clock as it now is (the whole two periods), not the TTL an in-place hit would keep."""
    policy = Policy("api", rate="100/10s", algorithm="sliding_window")
    key = policy.redis_key("10.0.0.1")
    assert hit(policy, T + 15 * SECOND) == (True, 99)  # window T + 10 s
    assert_pttl(r, key, 15_000)
    assert hit(policy, T + 5 * SECOND) == (True, 98)  # 10 s back: still window T + 10 s
    assert_pttl(r, key, 20_000)
    assert r.strlen(key) == 19


def test_a_period_lengthened_in_settings_forgets_at_most_one_old_window() -> None:
    """docs/ratelimit.md, "Changing a rate": the count carries over at once, and is forgotten
    when the window in progress would have ended at the old period: over the new period, at
    most the old rate's count more than the new rate allows, never more."""
    old = Policy("deploy", rate="3/s", algorithm="fixed_window")
    assert [old.hit("u").allowed for _ in range(2)] == [True, True]
    new = Policy("deploy", rate="3/30s", algorithm="fixed_window")  # the same state key
    admitted = 2 + sum(new.hit("u").allowed for _ in range(3))
    assert admitted == 3  # the count carried over: one more, then denied
    time.sleep(1.1)  # the old window's end: its key expires
    admitted += sum(new.hit("u").allowed for _ in range(5))
    assert admitted == 6  # 3 of the old window + 3 of the new: no more


@pytest.mark.parametrize("algorithm", [*O1, "sliding_log"])
@pytest.mark.parametrize("value", list(FOREIGN.values()), ids=list(FOREIGN))
@pytest.mark.parametrize("rate", ["5/m", "500/m"])  # the log's string form, its sorted set
def test_a_value_another_writer_left_reads_as_no_state(
        algorithm: str, value: bytes, rate: str, r: Any) -> None:
    """Never read as a time centuries ahead (a denial until someone deletes the key) nor as a
    negative wait: the identity is decided as a fresh one, and the admitted hit replaces the
    value with the policy's own state."""
    policy = Policy("foreign", rate=rate, algorithm=algorithm)
    fresh = evaluate([(policy, "fresh", 1)], now_us=T)[0]
    key = policy.redis_key("10.0.0.1")
    r.set(key, value)
    assert peek(policy, T) == fresh.remaining + 1
    decision = evaluate([(policy, "10.0.0.1", 1)], now_us=T)[0]
    assert decision.allowed and decision.retry_after == 0
    assert (decision.remaining, decision.reset_after) == (fresh.remaining, fresh.reset_after)
    assert r.exists(key) and (r.type(key) != b"string" or r.get(key) != value)
    assert peek(policy, T) == fresh.remaining  # the policy's own state, read back


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window", "gcra", "sliding_log"])
@pytest.mark.parametrize("value", ["19 characters long!", "a hash"])
def test_what_cannot_be_read_as_state_is_a_redis_error(algorithm: str, value: str, r: Any
                                                       ) -> None:
    """The two cases docs/ratelimit.md leaves to FAIL_OPEN: a 19-character value that is not
    digits (the windows' decimal form) and a key of another type. The value stays as it was."""
    policy = Policy("unreadable", rate="5/m", algorithm=algorithm)
    key = policy.redis_key("10.0.0.1")
    if value == "a hash":
        r.hset(key, "field", "value")
    else:
        r.set(key, value)
    if value == "a hash" or algorithm in ("fixed_window", "sliding_window"):
        with pytest.raises(redis.ResponseError):
            evaluate([(policy, "10.0.0.1", 1)], now_us=T)
        assert (r.hgetall(key) == {b"field": b"value"} if value == "a hash"
                else r.get(key) == value.encode())
    else:  # not a form of these: no state, replaced
        assert evaluate([(policy, "10.0.0.1", 1)], now_us=T)[0].allowed


@pytest.mark.parametrize("algorithm", ["gcra", "token_bucket", "leaky_bucket"])
def test_a_changed_rate_reads_the_state_the_old_rate_wrote(algorithm: str) -> None:
    """The state is per name and identity, not per rate: a rate changed in settings (or by a
    live override) reads what the old one wrote, whose remainder of 1/Q us may be above the
    new Q. That is the policy's own state, not another writer's: what was used still counts."""
    before = Policy("rate-change", rate="7/s", algorithm=algorithm)
    after = Policy("rate-change", rate="5/s", algorithm=algorithm)
    for _ in range(6):
        assert hit(before, T)[0]  # GCRA's remainder: 6 x 10^6 mod 7 = 6, the new Q is 1
    assert peek(after, T) < peek(after, T, key="fresh")
    later = T + 150_001  # a token's refill at 7/s has come: the bucket keeps its remainder
    assert hit(before, later)[0]
    assert peek(after, later) < peek(after, later, key="fresh")
