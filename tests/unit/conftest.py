"""The unit tier: tests that need no Redis at all (issue 36's test pyramid).

Every test under ``tests/unit/`` is marked ``unit`` (tests/conftest.py), and so is a pure test
elsewhere that says so (``pytest.mark.unit``). A unit test runs with no server reachable: the
root conftest's per-test flush is skipped and ``REDISLUA["CONNECTION"]`` points at a closed
port, so one that reaches for Redis by accident fails at once instead of quietly using one.
Protocols are driven by scripted replies and a virtual clock (``tests/unit/scripted.py``);
keys, rates, headers and checks are plain functions.

Run the tier alone with ``python3 dev.py test --unit`` (``pytest -m unit`` with ``REDIS_URL``
at a closed port): no Redis server and no ``redis-server`` binary needed.
"""
