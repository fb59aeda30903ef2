"""The recipes' behaviour on a real Redis, single server and cluster: every documented promise of
docs/recipes.md tried (and tried to break), each operation counted to one script call."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any

import pytest
import redis

from django_redislua.recipes import (
    CappedCounter,
    Inventory,
    QueueFull,
    RecipeUnavailable,
    Taken,
    VersionedCache,
    WindowStats,
    WorkQueue,
)
from django_redislua.testing import CommandRecorder

pytestmark = pytest.mark.topologies

SECOND = 1_000_000
T0 = 1_700_000_000 * SECOND


def keys_of(r: Any) -> list[str]:
    return sorted(k.decode() for k in r.scan_iter("*"))


# -- CappedCounter ----------------------------------------------------------------------------

def test_capped_counter_never_passes_its_cap(r: Any) -> None:
    downloads = CappedCounter("downloads", cap=3, ttl="1d")
    assert downloads.add("user:42") == (1, True)
    assert downloads.add("user:42", amount=2) == (3, True)
    assert downloads.add("user:42") == (3, False)
    assert downloads.add("user:7", amount=4) == (0, False)  # more than the cap at once
    assert downloads.value("user:42") == 3
    assert downloads.value("nobody") == 0
    [key] = [k for k in keys_of(r) if "user:42" in k]
    assert key == "rl:cap:downloads:{user:42}"
    assert 86_000_000 < r.pttl(key) <= 86_400_000


def test_capped_counter_starts_again_after_its_period(r: Any) -> None:
    counter = CappedCounter("c", cap=2, ttl=60)
    assert counter.add("s", 2, now_us=T0) == (2, True)
    assert counter.add("s", now_us=T0 + 59 * SECOND) == (2, False)
    assert counter.value("s", now_us=T0 + 60 * SECOND) == 0
    assert counter.add("s", now_us=T0 + 60 * SECOND) == (1, True)
    assert counter.reset("s") is True
    assert counter.value("s", now_us=T0 + 61 * SECOND) == 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, 2**53])
def test_capped_counter_refuses_bad_amounts(bad: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        CappedCounter("c", cap=10, ttl=1).add("s", bad)


def test_one_script_call_per_operation(r: Any, recorder: CommandRecorder) -> None:
    stock, queue = Inventory("sale"), WorkQueue("jobs")
    counter, stats, cache = CappedCounter("c", 5, 60), WindowStats("w"), VersionedCache("v")
    stock.set("sku", 5)

    def every_operation(round: int) -> None:
        counter.add("s")
        stock.take("sku", order_id=f"o{round}", user_id="u1", one_per_user=True)
        stock.give_back("sku", order_id=f"o{round}")
        queue.put({"n": round})
        task = queue.claim()
        assert task is not None
        queue.ack(task)
        stats.add("s", 1.5)
        stats.summary("s")
        cache.set("k", {"a": 1}, version=round)
        cache.get("k")

    every_operation(1)  # loads the scripts
    with recorder:
        every_operation(2)
    assert recorder.commands == ["EVALSHA"] * 10


# -- Inventory --------------------------------------------------------------------------------

def test_inventory_takes_once_per_order_and_gives_back_once(r: Any) -> None:
    stock = Inventory("flash-sale")
    assert stock.set("sku-1", 5) == 5
    assert stock.take("sku-1", qty=2, order_id="o-17", user_id="u-9") == Taken(True, "ok", 3)
    # A retry of the same order takes nothing more, whatever qty it asks.
    assert stock.take("sku-1", qty=2, order_id="o-17") == Taken(True, "duplicate_order", 3)
    assert stock.take("sku-1", qty=5, order_id="o-17") == Taken(True, "duplicate_order", 3)
    assert stock.take("sku-1", qty=4, order_id="o-18") == Taken(False, "insufficient", 3)
    assert stock.give_back("sku-1", order_id="o-17") == Taken(True, "ok", 5)
    assert stock.give_back("sku-1", order_id="o-17") == Taken(False, "already_given_back", 5)
    assert stock.give_back("sku-1", order_id="nope") == Taken(False, "unknown_order", 5)
    # A given-back order id cannot take again.
    assert stock.take("sku-1", qty=1, order_id="o-17") == Taken(False, "duplicate_order", 5)
    assert stock.level("sku-1") == 5
    assert stock.level("other") is None


def test_inventory_one_per_user(r: Any) -> None:
    stock = Inventory("sale")
    stock.set("sku", 10)
    assert stock.take("sku", order_id="a", user_id="u", one_per_user=True).reason == "ok"
    assert stock.take("sku", order_id="b", user_id="u", one_per_user=True) == Taken(
        False, "duplicate_user", 9)
    stock.give_back("sku", order_id="a")  # frees the user
    assert stock.take("sku", order_id="c", user_id="u", one_per_user=True).reason == "ok"
    with pytest.raises(ValueError, match="user_id"):
        stock.take("sku", order_id="d", one_per_user=True)


def test_inventory_restock_and_lifetime(r: Any) -> None:
    stock = Inventory("sale", ttl="1h")
    with pytest.raises(LookupError):
        stock.add("sku", 3)
    stock.set("sku", 1)
    stock.take("sku", order_id="o", user_id="u")
    assert stock.add("sku", 3) == 3
    assert stock.set("sku", 50, if_absent=True) == 3  # already selling: left as it is
    assert stock.set("new", 50, if_absent=True) == 50
    stock.clear("new")
    for name in keys_of(r):
        assert 3_500_000 < r.pttl(name) <= 3_600_000, name
    assert stock.clear("sku") is True
    assert keys_of(r) == []


def test_hostile_ids_never_make_long_keys_or_fields(r: Any) -> None:
    stock = Inventory("sale")
    stock.set("x" * 10_000, 10)
    assert stock.take("x" * 10_000, order_id="o " * 5000, user_id="{u}" * 3000).ok
    for name in keys_of(r):
        assert len(name) < 120, name
        if r.type(name) == b"hash":
            assert all(len(f) <= 64 and len(v) <= 80 for f, v in r.hgetall(name).items())


# -- WorkQueue --------------------------------------------------------------------------------

def test_work_queue_claims_acks_and_bounds(r: Any) -> None:
    q = WorkQueue("emails", max_in_flight=2, visibility_timeout="5m", max_length=3)
    ids = [q.put({"to": f"{n}@example.com"}) for n in range(3)]
    with pytest.raises(QueueFull):
        q.put({"to": "late@example.com"})
    first, second = q.claim(), q.claim()
    assert first is not None and second is not None
    assert [first.id, second.id] == ids[:2]
    assert first.payload == {"to": "0@example.com"} and first.attempts == 1
    assert q.claim() is None  # two in flight
    assert q.stats() == (1, 2, 0, 0)
    assert q.ack(first) is True
    assert q.ack(first) is False
    third = q.claim()
    assert third is not None and third.id == ids[2]
    assert q.release(second) is True
    again = q.claim()
    assert again is not None and again.id == ids[1] and again.attempts == 2
    assert q.ack(second) is False  # the old claim's token no longer holds it


def test_work_queue_returns_a_dead_workers_task(r: Any) -> None:
    q = WorkQueue("jobs", visibility_timeout=0.2, max_attempts=2)
    q.put("job")
    lost = q.claim()
    assert lost is not None
    time.sleep(0.25)
    assert q.stats().expired == 1
    retry = q.claim()
    assert retry is not None and retry.id == lost.id and retry.attempts == 2
    assert q.ack(lost) is False and q.extend(lost) is None
    assert q.extend(retry) is not None
    time.sleep(0.25)
    assert q.claim() is None  # max_attempts used up: dead
    assert q.stats() == (0, 0, 0, 1)


def test_work_queue_refuses_what_json_cannot_write() -> None:
    with pytest.raises(TypeError):
        WorkQueue("q").put(object())


# -- VersionedCache ---------------------------------------------------------------------------

def test_versioned_cache_keeps_the_newest(r: Any) -> None:
    cache = VersionedCache("catalog")
    assert cache.set("page:1", {"v": 7}, version=7, ttl="1h") is True
    assert cache.set("page:1", {"v": 6}, version=6, ttl="1h") is False
    assert cache.set("page:1", {"v": 7}, version=7, ttl="1h") is False
    assert cache.get("page:1") == {"v": 7}
    assert cache.get_versioned("page:1") == ({"v": 7}, 7)
    assert cache.get("missing", "default") == "default"


def test_get_or_build_does_not_overwrite_a_newer_set(r: Any) -> None:
    cache = VersionedCache("catalog")

    def build() -> str:
        cache.set("k", "fresh from a writer", version=3)
        return "built from older data"

    assert cache.get_or_build("k", build) == "built from older data"
    assert cache.get_versioned("k") == ("fresh from a writer", 3)


def test_get_or_build_serves_the_stale_copy_while_one_rebuilds(r: Any) -> None:
    cache = VersionedCache("c")
    assert cache.get_or_build("k", lambda: "v1", ttl=0.1, stale_ttl=60) == "v1"
    time.sleep(0.15)
    assert cache.get("k") is None  # stale is not fresh

    def rebuild() -> str:
        # Another caller meanwhile is served the stale copy without building.
        assert cache.get_or_build("k", lambda: pytest.fail("built twice"), ttl=1) == "v1"
        return "v2"

    assert cache.get_or_build("k", rebuild, ttl=60) == "v2"
    assert cache.get_versioned("k") == ("v2", 0)


# -- WindowStats ------------------------------------------------------------------------------

def test_window_stats_slide(r: Any) -> None:
    stats = WindowStats("latency", window="1m", buckets=6)
    for n, sample in enumerate([0.5, 0.125, 2.0]):
        stats.add("checkout", sample, now_us=T0 + n * SECOND)
    assert stats.summary("checkout", now_us=T0 + 2 * SECOND) == (3, 2.625, 0.125, 2.0)
    stats.add("checkout", 1.0, now_us=T0 + 30 * SECOND)
    assert stats.summary("checkout", now_us=T0 + 65 * SECOND) == (1, 1.0, 1.0, 1.0)
    assert stats.summary("checkout", now_us=T0 + 100 * SECOND) == (0, 0.0, None, None)
    [key] = keys_of(r)
    assert r.hlen(key) <= 5 * 6


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1", None])
def test_window_stats_refuses_non_numbers(bad: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        WindowStats("w").add("s", bad)


# -- asyncio twins ----------------------------------------------------------------------------

def test_async_twins(r: Any) -> None:
    async def main() -> None:
        stock = Inventory("sale")
        await stock.aset("sku", 2)
        assert await stock.atake("sku", order_id="o") == Taken(True, "ok", 1)
        assert await stock.agive_back("sku", order_id="o") == Taken(True, "ok", 2)
        counter = CappedCounter("c", cap=1, ttl=60)
        assert await counter.aadd("s") == (1, True)
        assert await counter.aadd("s") == (1, False)
        q = WorkQueue("q")
        await q.aput([1, 2])
        task = await q.aclaim()
        assert task is not None and task.payload == [1, 2]
        assert await q.aack(task) is True
        cache = VersionedCache("v")

        async def build() -> int:
            return 41

        assert await cache.aget_or_build("k", build) == 41
        assert await cache.aset("k", 42, version=1) is True
        assert await cache.aget("k") == 42
        stats = WindowStats("w")
        await stats.aadd("s", 3.0)
        assert (await stats.asummary("s)")).samples == 0
        assert (await stats.asummary("s")).samples == 1

    asyncio.run(main())


RECIPES = (CappedCounter, Inventory, VersionedCache, WindowStats, WorkQueue)
PURE = {"key", "keys"}  # name Redis keys; ask nothing


def test_every_recipe_method_has_an_async_twin() -> None:
    """docs/recipes.md: "every method has an a-prefixed coroutine"; and no coroutine without
    its sync twin."""
    for cls in RECIPES:
        public = {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}
        coroutines = {n for n in public if inspect.iscoroutinefunction(getattr(cls, n))}
        sync = public - coroutines - PURE
        assert {f"a{n}" for n in sync} == coroutines, cls.__name__


def test_the_other_async_twins_answer_as_their_sync_twins(r: Any) -> None:
    """The twins test_async_twins does not call, each against its sync twin on one state."""
    async def main() -> None:
        stock = Inventory("twins")
        stock.set("sku", 3)
        assert await stock.alevel("sku") == stock.level("sku") == 3
        assert await stock.aadd("sku", 2) == 5
        assert await stock.aclear("sku") is True and stock.level("sku") is None
        counter = CappedCounter("twins", cap=5, ttl=60)
        counter.add("s", 2)
        assert await counter.avalue("s") == counter.value("s") == 2
        assert await counter.areset("s") is True and counter.value("s") == 0
        queue = WorkQueue("twins", visibility_timeout=30)
        queue.put("x")
        assert await queue.astats() == queue.stats()
        task = await queue.aclaim()
        assert task is not None
        extended = await queue.aextend(task)  # the new deadline, on the server's clock
        now = float(r.time()[0])
        assert extended is not None and now < extended <= now + 31  # 30 s from the extend
        assert await queue.arelease(task) is True
        assert (await queue.astats()).pending == 1
        assert await queue.aclear() is True and queue.stats().pending == 0
        cache = VersionedCache("twins")
        cache.set("k", "v", version=3)
        versioned = await cache.aget_versioned("k")
        assert versioned == cache.get_versioned("k") and versioned is not None
        assert versioned.version == 3
        assert await cache.adelete("k") is True and cache.get("k") is None
        assert await cache.adelete("k") is False
        stats = WindowStats("twins")
        stats.add("s", 1.0)
        assert await stats.areset("s") is True and stats.summary("s").samples == 0

    asyncio.run(main())


def test_redis_down_raises_recipe_unavailable(settings: Any) -> None:
    settings.REDISLUA = {**settings.REDISLUA, "CONNECTION": "redis://127.0.0.1:1/0"}
    with pytest.raises(RecipeUnavailable):
        Inventory("sale").take("sku", order_id="o")
    with pytest.raises(RecipeUnavailable):
        VersionedCache("v").get_or_build("k", lambda: 1)


def test_redis_error_type_is_not_swallowed() -> None:
    assert issubclass(RecipeUnavailable, Exception)
    assert not issubclass(RecipeUnavailable, redis.RedisError)


def test_capped_counter_and_window_stats_follow_advance(r: Any) -> None:
    """docs/recipes.md: both follow the testing helpers' advance() (the plugin's
    ``redislua.advance``), so a user's test need not sleep through a period or a window."""
    from django_redislua.limiting import clock

    counter = CappedCounter("adv", cap=1, ttl=60)
    stats = WindowStats("adv", window=60, buckets=6)
    assert counter.add("s") == (1, True)
    assert counter.add("s") == (1, False)
    stats.add("s", 2.0)
    try:
        clock.advance(61)
        assert counter.value("s") == 0
        assert counter.add("s") == (1, True)
        assert stats.summary("s") == (0, 0.0, None, None)
    finally:
        clock.reset()
    assert stats.summary("s").samples == 1
