"""Other packages' internals the app relies on (docs/versions.md, "Other packages' internals we
rely on"): each row's internal is there on the installed versions, so an upgrade that drops one
fails here naming its row; and with it gone, its feature test says so and the app takes the
row's fallback (a public path, or a clear error naming the version), never an AttributeError
inside a request."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import django
import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.connection
import redis.cluster
import redis.connection
import redis.utils
from asgiref.sync import AsyncToSync, async_to_sync
from django.core.cache.backends.redis import RedisCache
from django.core.signals import request_finished
from django.db import close_old_connections
from django.http import HttpResponse
from django.test import override_settings

from django_redislua import (
    atransport,
    connection,
    direct,
    exchange,
    lean,
    metrics,
    pipelining,
    responses,
    sockets,
    transport,
)
from django_redislua.limiting import Policy

VERSIONS = Path(__file__).resolve().parent.parent / "docs" / "versions.md"
REDIS_PY = f"redis-py {redis.__version__}"


def needs_lean() -> bool:
    return lean._version(redis.__version__) >= lean.LEAN_SINCE


# Each row of the table, by its first cell: its feature test, and whether this environment
# uses it (the lean transport's internals only from redis-py 8.1).
ROWS: dict[str, tuple[Callable[[], Any], Callable[[], bool]]] = {
    "`PipelineCommand`, `ClusterNode.execute_pipeline`":
        (exchange.has_async_cluster_pipeline, lambda: True),
    "`RedisCluster.nodes_manager.initialize()`": (exchange.has_table_refresh, lambda: True),
    "`read_response(push_request=True, disconnect_on_error=False)`, `PubSub.connection`, "
    "`PubSub.handle_message`": (exchange.has_direct_pubsub_read, needs_lean),
    "a connection closed by another thread fails with `AttributeError`/`TypeError` in "
    "`redis/_parsers/`, `send_packed_command`, `_send_packed_command` or `can_read`":
        (connection.has_redis_parsers, lambda: True),
    "`Connection.is_connected`, `can_read`, `send_packed_command`, `pack_commands` (sync and "
    "asyncio); `redis.utils.HIREDIS_AVAILABLE`":
        (lambda: lean.has_connection_api() and hasattr(redis.utils, "HIREDIS_AVAILABLE"),
         needs_lean),
    "`Connection.is_connected`, `can_read` (`can_read_destructive` before 8.0), `connect`, "
    "`disconnect`, `send_packed_command(check_health=False)`, `read_response` (with "
    "`disconnect_on_error=False`), `pack_commands` (asyncio)":
        (pipelining.has_connection_api, lambda: True),
    "`Connection._writer`, `Connection._read_response_from_parser()` (asyncio)":
        (direct.has_stream_api, lambda: lean._version(redis.__version__) >= (8, 1)),
    "`Connection._sock`, `Connection._host_error()`, the parser `_HiredisParser` (`_reader`, "
    "`_buffer`, `_hiredis_PushNotificationType`, `handle_push_response`, `on_connect`) and "
    "`NOT_ENOUGH_DATA` of `redis._parsers.hiredis` (sync); Linux's `TCP_INFO`":
        (sockets.has_socket_api, lambda: needs_lean() and sys.platform == "linux"),
    "`ClusterNode.acquire_connection`, `ClusterNode.release` (asyncio)":
        (pipelining.has_node_release, lambda: lean._version(redis.__version__) >= (6, 4)),
    "`caches[alias]._cache.get_client(write=True)`": (connection.has_django_cache_client,
                                                      lambda: True),
    "`response._has_been_logged`, read by `django.utils.log.log_response`":
        (responses.has_log_mark, lambda: True),
    "`HttpResponseBase._resource_closers`": (responses.has_resource_closers, lambda: True),
    "`AsyncToSync.loop_thread_executors`": (connection.has_loop_thread_executors, lambda: True),
    "`CollectorRegistry._names_to_collectors`":
        (lambda: metrics.registered_by_name(_prometheus_registry()) is not None, lambda: True),
}


def _prometheus_registry() -> Any:
    from prometheus_client import REGISTRY

    return REGISTRY


def installed() -> str:
    return (f"{REDIS_PY}, Django {django.get_version()}, asgiref {version('asgiref')}, "
            f"prometheus_client {version('prometheus_client')}")


@pytest.mark.unit
def test_the_table_lists_exactly_the_internals_tested_here() -> None:
    text = VERSIONS.read_text()
    section = text.split("## Other packages' internals we rely on", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]  # no header
    firsts = [re.split(r" \| ", row[2:], maxsplit=1)[0] for row in rows]
    assert firsts == list(ROWS)


@pytest.mark.unit
@pytest.mark.parametrize("row", list(ROWS))
def test_each_internal_is_there_on_the_installed_versions(row: str) -> None:
    feature, used = ROWS[row]
    if not used():
        pytest.skip(f"{REDIS_PY} does not use it (the lean transport is off before 8.1)")
    assert feature(), (
        f"docs/versions.md, \"Other packages' internals we rely on\": the row {row!r} is gone "
        f"on {installed()}: update the row (its fallback now applies) or the code")


# -- redis-py ------------------------------------------------------------------------------------

@pytest.mark.unit
def test_without_the_asyncio_cluster_pipeline_a_call_fails_clearly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(redis.asyncio.cluster, "PipelineCommand")
    assert not exchange.has_async_cluster_pipeline()
    monkeypatch.setattr(exchange, "ASYNC_CLUSTER_PIPELINE", False)

    async def hit() -> None:
        with override_settings(REDISLUA={"CONNECTION": "redis+cluster://127.0.0.1:1"}):
            with pytest.raises(redis.exceptions.RedisClusterException,
                               match=re.escape(f"{REDIS_PY} has no asyncio cluster")):
                await Policy("internals-acluster", rate="5/m").ahit("k")
            assert isinstance(atransport.acurrent(), atransport.AsyncUnbuilt)

    asyncio.run(hit())


@pytest.mark.unit
def test_without_execute_pipeline_the_feature_test_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(redis.asyncio.cluster.ClusterNode, "execute_pipeline")
    assert not exchange.has_async_cluster_pipeline()


@pytest.mark.unit
def test_without_the_table_refresh_a_cluster_transport_fails_clearly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(redis.cluster.NodesManager, "initialize")
    assert not exchange.has_table_refresh()
    monkeypatch.setattr(exchange, "TABLE_REFRESH", False)
    with pytest.raises(redis.exceptions.RedisClusterException,
                       match=re.escape(f"{REDIS_PY} has no cluster NodesManager.initialize")):
        transport.ClusterTransport(object())  # type: ignore[arg-type]
    with pytest.raises(redis.exceptions.RedisClusterException, match="NodesManager"):
        atransport.AsyncClusterTransport(redis.asyncio.cluster.RedisCluster(host="127.0.0.1",
                                                                           port=1))


@pytest.mark.unit
def test_without_the_direct_pubsub_read_the_lean_transport_reads_with_get_message(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def read_response(self: Any, disable_decoding: bool = False) -> Any:
        """A redis-py whose read_response takes no push_request."""

    monkeypatch.setattr(redis.connection.Connection, "read_response", read_response)
    assert not exchange.has_direct_pubsub_read()
    client = redis.Redis(host="127.0.0.1", port=1)  # connects on first use: never here
    assert transport.ServerTransport(client).lean_reads == lean.SUPPORTED
    monkeypatch.setattr(exchange, "DIRECT_PUBSUB_READ", False)
    found = transport.ServerTransport(client)
    assert not found.lean_reads
    assert isinstance(found.source, lean.KeptConnections) == lean.SUPPORTED  # calls stay lean


@pytest.mark.unit
def test_without_the_lean_connection_api_the_reference_transport_is_used(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis.connection, "Connection", type("Connection", (), {}))
    assert not lean.has_connection_api()
    monkeypatch.undo()
    monkeypatch.setattr(lean, "SUPPORTED", False)
    found = transport.ServerTransport(redis.Redis(host="127.0.0.1", port=1))
    assert isinstance(found.source, transport.PoolSource) and not found.lean_reads


@pytest.mark.unit
def test_without_the_shared_connection_api_asyncio_calls_take_a_connection_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis.asyncio.connection, "Connection", type("Connection", (), {}))
    assert not pipelining.has_connection_api()
    monkeypatch.undo()

    class OlderConnection(redis.asyncio.connection.Connection):
        async def read_response(self, disable_decoding: bool = False) -> Any:  # type: ignore[override]
            raise AssertionError("never called")

    monkeypatch.setattr(redis.asyncio.connection, "Connection", OlderConnection)
    assert not pipelining.has_connection_api()  # a read that would close on a cancellation
    monkeypatch.undo()
    monkeypatch.setattr(pipelining, "SUPPORTED", False)
    found = atransport.AsyncServerTransport(redis.asyncio.Redis(host="127.0.0.1", port=1))
    assert found.shared is None


@pytest.mark.unit
def test_without_the_stream_api_the_shared_connection_uses_redis_pys_methods(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Every test of tests/unit/test_pipelining.py runs both ways ("methods": as here).
    monkeypatch.delattr(redis.asyncio.connection.AbstractConnection,
                        "_read_response_from_parser", raising=False)
    assert not direct.has_stream_api()
    monkeypatch.setattr(direct, "STREAM_API", False)
    pool = redis.asyncio.ConnectionPool(host="127.0.0.1", port=1)
    assert pipelining.SharedConnection(pool)._deadlines is None  # redis-py's timer per read


@pytest.mark.unit
def test_without_the_socket_api_kept_connections_use_redis_pys_methods(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # tests/test_lean_path.py runs every sync test this way too (the path "lean-methods").
    monkeypatch.delattr(redis._parsers.hiredis, "NOT_ENOUGH_DATA", raising=False)
    monkeypatch.setattr(sockets, "NOT_ENOUGH_DATA", None)
    assert not sockets.has_socket_api()
    monkeypatch.setattr(sockets, "SOCKET_API", False)
    conn = redis.connection.Connection()
    conn._sock = socket.socket()
    try:
        assert sockets.mark(conn) is None
        kept = lean.KeptConnections(redis.ConnectionPool(host="127.0.0.1", port=1))
        kept._taken_over(conn, None)
        assert conn not in kept._direct
    finally:
        conn._sock.close()


@pytest.mark.unit
def test_without_hiredis_available_redis_py_packs(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = redis.ConnectionPool(host="127.0.0.1", port=1)
    assert (lean.packer(pool) is not None) == (lean.hiredis_pack is not None
                                                and redis.utils.HIREDIS_AVAILABLE)
    monkeypatch.setattr(lean, "HIREDIS_AVAILABLE", False)
    assert lean.packer(pool) is None


@pytest.mark.unit
def test_without_a_cluster_nodes_release_its_calls_are_not_batched(
        monkeypatch: pytest.MonkeyPatch) -> None:
    node = redis.asyncio.cluster.ClusterNode("127.0.0.1", 1, server_type="primary")
    cluster = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=1)
    found = atransport.AsyncClusterTransport(cluster)
    if pipelining.NODE_RELEASE:
        assert isinstance(found.node_connection(node), pipelining.SharedConnection)
    monkeypatch.delattr(redis.asyncio.cluster.ClusterNode, "release", raising=False)
    assert not pipelining.has_node_release()  # as on redis-py before 6.4
    monkeypatch.setattr(pipelining, "NODE_RELEASE", False)
    assert atransport.AsyncClusterTransport(cluster).node_connection(node) is None


def torn_down_read(url: str) -> BaseException:
    """The failure of a read on a connection closed under it, with redis-py's Python parser
    (the hiredis one reports a closed connection as a ConnectionError)."""
    pool = redis.ConnectionPool.from_url(url, parser_class=redis.connection._RESP2Parser)
    conn = connection.checkout(pool)()
    try:
        conn.send_command("PING")
        conn.disconnect()  # what another thread's pool.disconnect() does mid-call
        with pytest.raises(connection.TORN_DOWN) as failure:
            conn.read_response()
        return failure.value
    finally:
        pool.disconnect()


def misspelt_option(url: str) -> BaseException:
    pool = redis.ConnectionPool.from_url(url, socket_timeot=1)
    with pytest.raises(TypeError) as failure:
        connection.checkout(pool)()
    return failure.value


@pytest.mark.parametrize("parsers_found", [True, False], ids=["parsers", "by-name"])
def test_a_connection_closed_under_a_read_is_told_from_a_mistake(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch, parsers_found: bool) -> None:
    """Real Redis: the reader torn down mid-call is a lost connection (retried or reported as
    one); a misspelt option is the user's TypeError. Both with redis-py's parsers where 5.0.1
    to 8.1 keep them, and, without them, known by their functions' names."""
    from tests.settings import REDIS_URL

    monkeypatch.setattr(connection, "REDIS_PARSERS", parsers_found)
    assert connection.closed_under_us(torn_down_read(REDIS_URL))
    assert not connection.closed_under_us(misspelt_option(REDIS_URL))


@pytest.mark.unit
def test_without_redis_parsers_the_feature_test_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection.importlib.util, "find_spec", lambda name: None)
    assert not connection.has_redis_parsers()


# -- Django --------------------------------------------------------------------------------------

def test_without_django_cache_client_a_sibling_pool_is_built(
        settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(RedisCache, "_cache")
    assert not connection.has_django_cache_client()
    monkeypatch.undo()
    monkeypatch.setattr(connection, "DJANGO_CACHE_CLIENT", False)
    caches = {**settings.CACHES, "timed": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": settings.REDIS_URL, "OPTIONS": {"socket_timeout": 2}}}
    with override_settings(CACHES=caches, REDISLUA={"CONNECTION": "timed"}):
        from django.core.cache import caches as django_caches

        ours = connection.get_client()
        theirs = django_caches["timed"]._cache.get_client(write=True)
        assert ours.connection_pool is not theirs.connection_pool
        assert ours.connection_pool.connection_kwargs["socket_timeout"] == 2  # the cache's
        assert Policy("internals-sibling", rate="5/m").hit("k").allowed


@pytest.mark.unit
@pytest.mark.parametrize("marked", [True, False], ids=["mark", "no-mark"])
def test_an_outage_503_is_kept_out_of_djangos_log_while_django_reads_the_mark(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, marked: bool) -> None:
    from django.utils.log import log_response

    if not marked:
        monkeypatch.setattr(responses, "log_response", lambda *a, **k: None)
        assert not responses.has_log_mark()
        monkeypatch.setattr(responses, "DJANGO_LOG_MARK", False)
    with caplog.at_level(logging.ERROR, logger="django.request"):
        log_response("Service Unavailable: %s", "/", response=responses.unavailable_response())
    assert (caplog.records == []) == marked  # without the mark: Django's own line, as documented


@pytest.mark.unit
@pytest.mark.parametrize("closers", [True, False], ids=["closers", "wrapped-close"])
def test_a_closer_runs_once_when_the_response_is_closed(
        monkeypatch: pytest.MonkeyPatch, closers: bool) -> None:
    if not closers:
        monkeypatch.setattr(responses.HttpResponseBase.close, "__code__",
                            (lambda self: None).__code__)
        assert not responses.has_resource_closers()
        monkeypatch.undo()
        monkeypatch.setattr(responses, "DJANGO_RESOURCE_CLOSERS", False)
    ran: list[int] = []
    response = HttpResponse("ok")
    responses.on_close(response, lambda: ran.append(1))
    assert ran == []
    # close() sends request_finished, whose database receiver a unit test must not reach.
    request_finished.disconnect(close_old_connections)
    try:
        response.close()
        response.close()
    finally:
        request_finished.connect(close_old_connections)
    assert ran == [1]


# -- asgiref -------------------------------------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("executors", [True, False], ids=["executors", "none"])
def test_a_loop_async_to_sync_made_for_one_call_is_told_while_asgiref_says(
        monkeypatch: pytest.MonkeyPatch, executors: bool) -> None:
    if not executors:
        monkeypatch.delattr(AsyncToSync, "loop_thread_executors")
        assert not connection.has_loop_thread_executors()
        monkeypatch.undo()
        monkeypatch.setattr(connection, "ASGIREF_LOOP_EXECUTORS", False)

    async def throwaway() -> bool:
        return connection.on_throwaway_loop()

    assert async_to_sync(throwaway)() == executors  # without: a lasting loop (a client of its own)
    assert not asyncio.run(throwaway())


# -- prometheus_client ---------------------------------------------------------------------------

@pytest.mark.unit
def test_a_second_registration_without_the_lookup_fails_naming_the_version(
        monkeypatch: pytest.MonkeyPatch) -> None:
    metrics._sink(metrics.PROMETHEUS)  # the instruments are registered
    monkeypatch.setattr(metrics, "registered_by_name", lambda registry: None)
    with pytest.raises(ValueError, match=re.escape(
            f"prometheus_client {version('prometheus_client')}'s registry has no "
            "_names_to_collectors")):
        metrics._Prometheus()


# -- replaced by public API ----------------------------------------------------------------------

@pytest.mark.unit
def test_closing_an_asyncio_sentinel_client_closes_its_sentinels_clients() -> None:
    """The Sentinel manager is the one the client was built from (no redis-py pool attribute
    read): closing the client closes the manager's clients of each sentinel too."""
    closed: list[int] = []

    async def build_and_close() -> None:
        with override_settings(REDISLUA={"CONNECTION":
                                         "redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster"}):
            client = connection.get_async_client()
            manager = connection._sentinel_managers[client]
            for n, sentinel in enumerate(manager.sentinels):
                close = sentinel.aclose

                async def recorded(n: int = n, close: Any = close) -> None:
                    closed.append(n)
                    await close()

                sentinel.aclose = recorded  # type: ignore[method-assign]
            await connection.aclose_client()

    asyncio.run(build_and_close())
    assert set(closed) == {0, 1}  # (and again when the loop ends: closing is idempotent)
