"""The engine and the locks on a real Redis 6.2 (no Functions, no 7.x-only command options)."""

import threading
import time

import pytest
from django.test import override_settings

from django_redislua import Policy
from django_redislua.functions import server_version
from django_redislua.limiting import evaluate
from django_redislua.locks import Lock, Semaphore


@pytest.fixture
def on_redis6(redis6):
    with override_settings(REDISLUA={"CONNECTION": redis6.url}):
        client = redis6.client()
        client.flushall()
        client.script_flush()
        assert server_version(client)[:2] == (6, 2)
        yield client


@pytest.mark.parametrize(
    ("algorithm", "options"),
    [
        ("fixed_window", {"rate": "3/m"}),
        ("sliding_log", {"rate": "3/m"}),
        ("sliding_window", {"rate": "3/m"}),
        ("token_bucket", {"rate": "3/m"}),
        ("leaky_bucket", {"rate": "3/m"}),
        ("gcra", {"rate": "3/m"}),
        ("concurrency", {"limit": 3}),
    ],
)
def test_every_algorithm_admits_exactly_its_limit(on_redis6, algorithm, options):
    policy = Policy(f"p6_{algorithm}", algorithm=algorithm, **options)
    assert [policy.hit("k").allowed for _ in range(5)] == [True] * 3 + [False] * 2
    assert policy.peek("k").remaining == 0


def test_several_policies_are_all_or_nothing(on_redis6):
    burst = Policy("b6", rate="1/m", algorithm="fixed_window")
    sustained = Policy("s6", rate="10/m", algorithm="gcra")
    assert all(evaluate([(burst, "u", 1), (sustained, "u", 1)]))
    assert [d.allowed for d in evaluate([(burst, "u", 1), (sustained, "u", 1)])] == [False, True]
    assert sustained.peek("u").remaining == 9


def test_locks_hand_off_and_semaphores(on_redis6):
    holder, waiter = Lock("l6", timeout=30), Lock("l6", timeout=30)
    assert holder.acquire()
    result = {}
    thread = threading.Thread(target=lambda: result.update(ok=waiter.acquire(blocking_timeout=5)))
    thread.start()
    deadline = time.monotonic() + 5
    while not on_redis6.zcard(waiter.keys.sub("queue")):
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.005)
    holder.release()
    thread.join(5)
    assert result["ok"] and waiter.token > holder.token
    waiter.release()
    permits = Semaphore("s6", limit=1, timeout=30)
    assert permits.acquire(blocking=False) and not permits.acquire(blocking=False)


def test_admin_status_says_functions_need_redis_7(on_redis6):
    from django_redislua.limiting.inspect import server_status

    assert [node.functions for node in server_status()] == ["needs Redis 7"]
