"""Model tests of the recipes (issue 16): random operation sequences through the recipes on real
Redis (single server and cluster) and through pure-Python models must agree on every reply.

``CappedCounter`` and ``WindowStats`` take injected time (``now_us=``), so nothing sleeps. Their
keys expire in *real* time, which injected time does not follow; so, as in
test_engine_properties.py, every script call runs inside MULTI/EXEC together with PTTL (checked
against the expiry the model says the key needs) and PERSIST, which keeps the state for the next
injected step: the Lua must then treat state past its period or window exactly as a missing key,
which the models assume. ``Inventory`` and ``WorkQueue`` are driven by Hypothesis state machines
(``WorkQueue`` with a visibility timeout of an hour: no claim expires during a run).

REDISLUA_PROPERTY_EXAMPLES=500 for a deeper hunt than the quick default.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from django_redislua import transport
from django_redislua.connection import get_client
from django_redislua.recipes import (
    CappedCounter,
    Count,
    Inventory,
    QueueFull,
    Summary,
    Taken,
    Task,
    WindowStats,
    WorkQueue,
)
from tests.transactional import TransactionalClient

pytestmark = pytest.mark.topologies

SECOND = 1_000_000
BASE_US = 1_700_000_000 * SECOND
EXAMPLES = int(os.environ.get("REDISLUA_PROPERTY_EXAMPLES", "50"))
MODEL_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
MACHINE_SETTINGS = settings(
    max_examples=2 * EXAMPLES,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
_names = itertools.count()


def unique(prefix: str) -> str:
    """A recipe name no earlier example used: each example starts from empty keys."""
    return f"{prefix}{next(_names)}"


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> TransactionalClient:
    client = TransactionalClient(get_client())
    through_it = transport.transport_for(client)  # every script call of the recipes goes here
    monkeypatch.setattr(transport, "get_transport", lambda: through_it)
    return client


def assert_pttl(observed: int, expected_us: int) -> None:
    """A key just given ``expected_us`` to live (PEXPIRE rounds up to whole ms, and gives at
    least a second: see recipe_counter_add.lua). PTTL is read in the same transaction, but a
    loaded machine can stall the server between commands; the upper bound is the exact one."""
    expected_ms = max(1000, math.ceil(expected_us / 1000))
    assert expected_ms - 250 <= observed <= expected_ms


# -- CappedCounter ----------------------------------------------------------------------------

COUNTER_SUBJECTS = st.sampled_from(["alice", "bob", "x" * 100])  # the last one is a digest
PERIODS_US = st.one_of(
    st.sampled_from([1, 2, 999, 1000, 1001, SECOND, 60 * SECOND]),
    st.integers(1, 10 * SECOND),
)


@dataclass
class CounterModel:
    """Per subject: the value and the end of its period. A period starts at an accepted add
    when none runs (``end <= now``), and lasts ``period_us``; a refused add writes nothing."""

    cap: int
    period_us: int
    periods: dict[str, tuple[int, int]] = field(default_factory=dict)

    def value(self, subject: str, now: int) -> int:
        value, end = self.periods.get(subject, (0, 0))
        return value if end > now else 0

    def add(self, subject: str, amount: int, now: int) -> tuple[Count, int]:
        """The reply, and the end of the period (for the key's expiry)."""
        value, end = self.periods.get(subject, (0, 0))
        if end <= now:
            value, end = 0, now + self.period_us
        if value + amount > self.cap:
            return Count(value, False), end
        self.periods[subject] = (value + amount, end)
        return Count(value + amount, True), end

    def reset(self, subject: str) -> bool:
        # The key outlives its period here (PERSIST): it exists until reset once an add took.
        return self.periods.pop(subject, None) is not None


def time_step(data: st.DataObject, now: int, span_us: int, edges: list[int],
              small_us: int | None = None) -> int:
    """How far the clock moves: not at all, 1 us, within ``small_us`` or ``span_us``, past
    ``span_us``, or onto one of ``edges`` (the times a period or bucket ends), 1 us before it
    or 1 us after."""
    kind = data.draw(st.sampled_from(
        ["zero", "one", "small", "within", "beyond", "edge", "edge"]))
    if kind == "zero":
        return 0
    if kind == "one":
        return 1
    if kind == "small":
        return data.draw(st.integers(0, small_us or span_us))
    if kind == "within":
        return data.draw(st.integers(0, span_us))
    if kind == "beyond":
        return data.draw(st.integers(span_us, 3 * span_us))
    ahead = [edge for edge in edges if edge + 1 >= now]
    if not ahead:
        return data.draw(st.integers(0, span_us))
    edge = data.draw(st.sampled_from(sorted(ahead)))
    return max(0, edge + data.draw(st.sampled_from([-1, 0, 1])) - now)


@MODEL_SETTINGS
@given(data=st.data())
def test_capped_counter_matches_model(frozen: TransactionalClient, data: st.DataObject) -> None:
    cap = data.draw(st.integers(0, 6), label="cap")
    period_us = data.draw(PERIODS_US, label="period_us")
    counter = CappedCounter(unique("cap"), cap=cap, ttl=period_us / SECOND)
    assert counter.period_us == period_us
    model = CounterModel(cap, period_us)
    now = BASE_US + data.draw(st.integers(0, period_us))
    for _ in range(data.draw(st.integers(1, 30))):
        edges = [end for _value, end in model.periods.values()]
        now += time_step(data, now, period_us, edges)
        subject = data.draw(COUNTER_SUBJECTS)
        key = counter.key(subject)
        action = data.draw(st.sampled_from(["add", "add", "add", "value", "reset"]))
        if action == "add":
            amount = data.draw(st.integers(1, cap + 2))
            expected, end = model.add(subject, amount, now)
            assert counter.add(subject, amount, now_us=now) == expected, (subject, now)
            if expected.accepted:
                assert_pttl(frozen.pttls[key], end - now)
                continue
        elif action == "value":
            assert counter.value(subject, now_us=now) == model.value(subject, now), (subject, now)
        else:
            assert counter.reset(subject) is model.reset(subject)
        # Refused adds and reads write nothing: the key is as the last write left it.
        assert frozen.pttls[key] == (-1 if subject in model.periods else -2)


# -- WindowStats ------------------------------------------------------------------------------

WINDOW_SUBJECTS = st.sampled_from(["checkout", "search"])
BUCKETS = st.one_of(st.integers(1, 6), st.sampled_from([10, 60, 1000]))
WIDTHS_US = st.one_of(
    st.integers(1, 3), st.sampled_from([1000, SECOND, 6 * SECOND]), st.integers(1, 2 * SECOND))
# Finite doubles over the magnitudes a sum of doubles is meaningful for (no overflow: at most
# 40 samples of at most 1e300), negatives, both zeros, subnormals.
SAMPLES = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.1, 0.2, 0.3, 1e300, -1e300, 5e-324]),
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
    st.floats(-1e300, 1e300, allow_nan=False, allow_infinity=False),
    st.floats(-1e-9, 1e-9, allow_nan=False, allow_infinity=False),
    st.integers(-(2**53), 2**53).map(float),
)
@dataclass
class WindowModel:
    """Every sample with its bucket number (floor(now / width)); a summary covers the samples
    whose bucket is in (current - buckets, current]."""

    width_us: int
    buckets: int
    samples: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    def add(self, subject: str, sample: float, now: int) -> int:
        """Records the sample; returns how long the key must live (its newest bucket's end of
        the window)."""
        bucket = now // self.width_us
        self.samples.setdefault(subject, []).append((bucket, sample))
        return (bucket + self.buckets) * self.width_us - now

    def covered(self, subject: str, now: int) -> list[float]:
        current = now // self.width_us
        return [sample for bucket, sample in self.samples.get(subject, [])
                if current - self.buckets < bucket <= current]

    def reset(self, subject: str) -> bool:
        return bool(self.samples.pop(subject, None))


def assert_summary(got: Summary, covered: list[float]) -> None:
    assert got.samples == len(covered)
    if not covered:
        assert got == (0, 0.0, None, None)
        return
    assert got.minimum == min(covered) and got.maximum == max(covered)  # exact, -0.0 == 0.0
    exact = math.fsum(covered)
    # Naive summation errs by at most n * 2^-52 * sum(|x|), far inside 1e-9 * sum(|x|).
    slack = 1e-9 * math.fsum(abs(x) for x in covered)
    assert math.isclose(got.total, exact, rel_tol=1e-9, abs_tol=slack), (got.total, exact)


@MODEL_SETTINGS
@given(data=st.data())
def test_window_stats_matches_model(frozen: TransactionalClient, data: st.DataObject) -> None:
    buckets = data.draw(BUCKETS, label="buckets")
    width_us = data.draw(WIDTHS_US, label="width_us")
    window_us = width_us * buckets
    stats = WindowStats(unique("wstats"), window=window_us / SECOND, buckets=buckets)
    assert (stats.width_us, stats.buckets) == (width_us, buckets)
    model = WindowModel(width_us, buckets)
    now = BASE_US + data.draw(st.integers(0, window_us))
    for _ in range(data.draw(st.integers(1, 40))):
        start = now // width_us
        edges = [(start + k) * width_us for k in (1, 2, buckets - 1, buckets, buckets + 1)]
        now += time_step(data, now, window_us, edges, width_us)
        subject = data.draw(WINDOW_SUBJECTS)
        key = stats.key(subject)
        action = data.draw(st.sampled_from(["add", "add", "add", "summary", "summary", "reset"]))
        if action == "add":
            sample = data.draw(SAMPLES)
            assert stats.add(subject, sample, now_us=now) is True
            assert_pttl(frozen.pttls[key], model.add(subject, sample, now))
            continue
        if action == "summary":
            assert_summary(stats.summary(subject, now_us=now), model.covered(subject, now))
        else:
            assert stats.reset(subject) is model.reset(subject)
        assert frozen.pttls[key] == (-1 if subject in model.samples else -2)


def test_window_stats_total_of_tiny_samples(frozen: TransactionalClient) -> None:
    stats = WindowStats(unique("tiny"), window=1, buckets=1)
    stats.add("s", 1e-20, now_us=BASE_US)
    stats.add("s", 1e-20, now_us=BASE_US)
    assert stats.summary("s", now_us=BASE_US) == (2, 2e-20, 1e-20, 1e-20)


# -- Inventory --------------------------------------------------------------------------------

SKUS = st.sampled_from(["sku-1", "sku-2"])
ORDERS = st.sampled_from([f"o{n}" for n in range(6)])
USERS = st.sampled_from(["u0", "u1", "u2"])


@dataclass
class Order:
    qty: int
    user: str | None
    given_back: bool = False


@dataclass
class Sku:
    left: int | None = None  # None: no stock set
    orders: dict[str, Order] = field(default_factory=dict)

    def holding(self, user: str) -> bool:
        return any(o.user == user and not o.given_back for o in self.orders.values())


class InventoryMachine(RuleBasedStateMachine):
    """One sale over two SKUs, takes with and without ``one_per_user`` mixed."""

    def __init__(self) -> None:
        super().__init__()
        self.client = get_client()
        self.stock = Inventory(unique("sale"))
        self.skus: dict[str, Sku] = {}

    def sku(self, name: str) -> Sku:
        return self.skus.setdefault(name, Sku())

    @rule(name=SKUS, units=st.integers(0, 6))
    def set(self, name: str, units: int) -> None:
        assert self.stock.set(name, units) == units
        self.sku(name).left = units

    @rule(name=SKUS, units=st.integers(1, 4))
    def restock(self, name: str, units: int) -> None:
        sku = self.sku(name)
        if sku.left is None:
            with pytest.raises(LookupError):
                self.stock.add(name, units)
            return
        sku.left += units
        assert self.stock.add(name, units) == sku.left

    @rule(name=SKUS, qty=st.integers(1, 3), order_id=ORDERS, user=st.none() | USERS,
          one_per_user=st.booleans())
    def take(self, name: str, qty: int, order_id: str, user: str | None,
             one_per_user: bool) -> None:
        if one_per_user and user is None:
            with pytest.raises(ValueError, match="user_id"):
                self.stock.take(name, qty, order_id=order_id, one_per_user=True)
            return
        sku = self.sku(name)
        left = sku.left or 0
        order = sku.orders.get(order_id)
        if order is not None:
            expected = Taken(not order.given_back, "duplicate_order", left)
        elif one_per_user and user is not None and sku.holding(user):
            expected = Taken(False, "duplicate_user", left)
        elif left < qty:
            expected = Taken(False, "insufficient", left)
        else:
            sku.left = left - qty
            sku.orders[order_id] = Order(qty, user)
            expected = Taken(True, "ok", sku.left)
        got = self.stock.take(name, qty, order_id=order_id, user_id=user,
                              one_per_user=one_per_user)
        assert got == expected

    @rule(name=SKUS, order_id=ORDERS)
    def give_back(self, name: str, order_id: str) -> None:
        sku = self.sku(name)
        left = sku.left or 0
        order = sku.orders.get(order_id)
        if order is None:
            expected = Taken(False, "unknown_order", left)
        elif order.given_back:
            expected = Taken(False, "already_given_back", left)
        else:
            order.given_back = True
            sku.left = left + order.qty
            expected = Taken(True, "ok", sku.left)
        assert self.stock.give_back(name, order_id) == expected

    @rule(name=SKUS)
    def clear(self, name: str) -> None:
        existed = self.skus.pop(name, Sku()).left is not None
        assert self.stock.clear(name) is existed

    @invariant()
    def levels_and_units_sold(self) -> None:
        for name in ("sku-1", "sku-2"):
            sku = self.skus.get(name, Sku())
            assert self.stock.level(name) == sku.left
            # The stock's "sold" field: the units the orders hold now.
            sold = self.client.hget(self.stock.keys(name)[0], "sold")
            held = sum(o.qty for o in sku.orders.values() if not o.given_back)
            assert int(sold or 0) == held

    def teardown(self) -> None:
        for name in ("sku-1", "sku-2"):
            self.stock.clear(name)


def test_inventory_matches_model() -> None:
    run_state_machine_as_test(InventoryMachine, settings=MACHINE_SETTINGS)


def test_inventory_one_per_user_after_orders_without_it(r: Any) -> None:
    stock = Inventory(unique("sale"))
    stock.set("sku", 5)
    assert stock.take("sku", order_id="a", user_id="u").ok
    assert stock.take("sku", order_id="b", user_id="u").ok
    assert stock.give_back("sku", order_id="b").ok
    # Order "a" of user "u" still holds its unit.
    assert stock.take("sku", order_id="c", user_id="u", one_per_user=True) == Taken(
        False, "duplicate_user", 4)


# -- WorkQueue --------------------------------------------------------------------------------

PAYLOADS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                 max_size=3),
    max_leaves=6,
)
VISIBILITY_S = 3600


class QueueMachine(RuleBasedStateMachine):
    """A queue with random bounds and an hour's visibility timeout: no claim expires, so every
    claim, ack, release and extend is decided by tokens, bounds and attempts alone."""

    claims = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        self.queue = WorkQueue(unique("jobs"))
        self.max_in_flight = 10
        self.max_length: int | None = None
        self.max_attempts: int | None = None
        self.sequence = 0
        self.pending: list[str] = []
        self.tasks: dict[str, Any] = {}  # pending and in flight: id -> payload
        self.holders: dict[str, str] = {}  # in flight: id -> token of the claim that holds it
        self.attempts: dict[str, int] = {}
        self.dead: dict[str, Any] = {}

    @initialize(max_in_flight=st.integers(1, 3), max_length=st.none() | st.integers(1, 5),
                max_attempts=st.none() | st.integers(1, 3))
    def configure(self, max_in_flight: int, max_length: int | None,
                  max_attempts: int | None) -> None:
        self.queue = WorkQueue(unique("jobs"), max_in_flight=max_in_flight,
                               visibility_timeout=VISIBILITY_S, max_length=max_length,
                               max_attempts=max_attempts)
        self.max_in_flight, self.max_length, self.max_attempts = (
            max_in_flight, max_length, max_attempts)

    @rule(payload=PAYLOADS)
    def put(self, payload: Any) -> None:
        if self.max_length is not None and len(self.tasks) >= self.max_length:
            with pytest.raises(QueueFull):
                self.queue.put(payload)
            return
        self.sequence += 1
        task_id = str(self.sequence)
        self.tasks[task_id] = payload
        self.pending.append(task_id)
        assert self.queue.put(payload) == task_id

    @rule(target=claims)
    def claim(self) -> Any:
        task = self.queue.claim()
        if len(self.holders) >= self.max_in_flight or not self.pending:
            assert task is None
            return multiple()
        task_id = self.pending.pop(0)
        self.attempts[task_id] = self.attempts.get(task_id, 0) + 1
        assert task is not None
        assert (task.id, task.payload, task.attempts) == (
            task_id, self.tasks[task_id], self.attempts[task_id])
        assert abs(task.deadline - (time.time() + VISIBILITY_S)) < 5
        self.holders[task_id] = task.token
        return task

    def holds(self, task: Task) -> bool:
        return self.holders.get(task.id) == task.token

    @rule(task=claims)
    def ack(self, task: Task) -> None:
        held = self.holds(task)
        if held:
            del self.holders[task.id], self.tasks[task.id], self.attempts[task.id]
        assert self.queue.ack(task) is held

    @rule(task=claims)
    def release(self, task: Task) -> None:
        held = self.holds(task)
        if held:
            del self.holders[task.id]
            if self.max_attempts is not None and self.attempts[task.id] >= self.max_attempts:
                self.dead[task.id] = self.tasks.pop(task.id)
                del self.attempts[task.id]
            else:
                self.pending.append(task.id)
        assert self.queue.release(task) is held

    @rule(task=claims)
    def extend(self, task: Task) -> None:
        deadline = self.queue.extend(task)
        if not self.holds(task):
            assert deadline is None
            return
        assert deadline is not None
        assert abs(deadline - (time.time() + VISIBILITY_S)) < 5

    @rule()
    def clear(self) -> None:
        # The id sequence lives on after every task is gone: the queue exists once put to.
        assert self.queue.clear() is (self.sequence > 0)
        self.sequence = 0
        self.pending, self.tasks, self.holders, self.attempts = [], {}, {}, {}
        self.dead = {}

    @invariant()
    def sizes(self) -> None:
        assert self.queue.stats() == (len(self.pending), len(self.holders), 0, len(self.dead))

    def teardown(self) -> None:
        self.queue.clear()


def test_work_queue_matches_model() -> None:
    run_state_machine_as_test(QueueMachine, settings=MACHINE_SETTINGS)
