import asyncio

import pytest
import redis
import redis.cluster
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_redislua.connection import (
    aclose_client,
    get_async_client,
    get_client,
    primary_nodes,
)
from django_redislua.endpoints import parse_url, resolve_endpoint


def test_url_connection(settings):
    # The library's defaults (the suite's settings set patient ones).
    settings.REDISLUA = {k: v for k, v in settings.REDISLUA.items()
                         if k not in ("SOCKET_TIMEOUT", "SOCKET_CONNECT_TIMEOUT")}
    client = get_client()
    assert client.ping()
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 0.5 and kwargs["socket_connect_timeout"] == 0.5


def test_django_cache_alias_pool_is_reused_when_it_has_a_timeout(settings):
    url = settings.REDIS_URL
    caches = {
        **settings.CACHES,
        "timed": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": url,
            "OPTIONS": {"socket_timeout": 2},
        },
    }
    with override_settings(CACHES=caches, REDISLUA={"CONNECTION": "timed"}):
        from django.core.cache import caches as django_caches

        ours = get_client()
        theirs = django_caches["timed"]._cache.get_client(write=True)
        assert ours.connection_pool is theirs.connection_pool
        assert ours.ping()


@pytest.mark.parametrize("alias", ["default", "django_redis"])
def test_cache_alias_without_timeout_gets_a_sibling_pool_with_ours(alias):
    with override_settings(REDISLUA={"CONNECTION": alias, "SOCKET_TIMEOUT": 0.25}):
        endpoint = resolve_endpoint()
        assert endpoint.cache_alias == alias
        client = get_client()
        assert client.ping()
        assert client.connection_pool.connection_kwargs["socket_timeout"] == 0.25


def test_non_redis_cache_is_refused():
    with (
        override_settings(REDISLUA={"CONNECTION": "locmem"}),
        pytest.raises(ImproperlyConfigured, match="not a Redis backend"),
    ):
        get_client()


def test_settings_change_rebuilds_the_client():
    first = get_client()
    with override_settings(REDISLUA={"CONNECTION": "default"}):
        assert get_client() is not first


def test_connection_options_are_passed(settings):
    with override_settings(
        REDISLUA={
            "CONNECTION": settings.REDIS_URL,
            "CONNECTION_OPTIONS": {"client_name": "redislua-test"},
        }
    ):
        client = get_client()
        assert client.client_getname() == "redislua-test"


async def test_async_client_per_loop():
    client = get_async_client()
    assert await client.ping()
    assert get_async_client() is client


def test_async_clients_differ_between_loops():
    async def grab():
        client = get_async_client()
        await client.ping()
        await aclose_client()
        return client

    a = asyncio.run(grab())
    b = asyncio.run(grab())
    assert a is not b


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("redis://127.0.0.1:6379/0", "single"),
        ("rediss://127.0.0.1:6380/1", "single"),
        ("unix:///tmp/redis.sock", "single"),
        ("redis+cluster://127.0.0.1:7000", "cluster"),
        ("redis+sentinel://127.0.0.1:26379,127.0.0.2:26380/mymaster/2", "sentinel"),
    ],
)
def test_parse_url(url, kind):
    endpoint = parse_url(url)
    assert endpoint.kind == kind
    if kind == "sentinel":
        assert endpoint.sentinels == (("127.0.0.1", 26379), ("127.0.0.2", 26380))
        assert endpoint.service_name == "mymaster" and endpoint.options["db"] == 2
    if kind == "cluster":
        assert endpoint.url == "redis://127.0.0.1:7000"


@pytest.mark.parametrize("url", ["http://x", "redis://", "redis+sentinel://h:1", "memcached://h"])
def test_parse_url_refuses(url):
    with pytest.raises(ImproperlyConfigured):
        parse_url(url)


def test_primary_nodes_single(settings):
    nodes = primary_nodes()
    assert len(nodes) == 1 and isinstance(nodes[0][1], redis.Redis)


@pytest.mark.cluster
def test_cluster_url_gives_a_cluster_client_and_every_primary(redis_cluster):
    with override_settings(REDISLUA={"CONNECTION": redis_cluster.url}):
        client = get_client()
        assert isinstance(client, redis.cluster.RedisCluster)
        assert len(primary_nodes()) == 3


def test_async_clients_of_short_lived_loops_are_closed_with_them():
    """Async views under WSGI run each call in a new loop (async_to_sync): no client outlives it."""
    import gc

    from asgiref.sync import async_to_sync

    from django_redislua.connection import _async_clients

    async def use():
        return await get_async_client().ping()

    for _ in range(5):
        assert async_to_sync(use)()
        assert asyncio.run(use())
    gc.collect()
    assert len(_async_clients) == 0


def test_a_settings_change_as_its_loop_ends_closes_both_clients_quietly(caplog) -> None:
    """An async test that changes settings and returns: the dropped client's close, started
    on the loop, is cancelled by asyncio.run's shutdown. It is not logged as an exception
    never retrieved, and both clients are closed all the same (each closer runs as the loop
    shuts down)."""
    import gc
    import logging

    from django.conf import settings as django_settings

    from django_redislua import Policy

    control = redis.Redis.from_url(django_settings.REDISLUA["CONNECTION"])
    policy = Policy("late-change", rate="10/h")

    async def main() -> None:
        await policy.ahit("a")
        with override_settings(REDISLUA={**django_settings.REDISLUA, "KEY_PREFIX": "late"}):
            await policy.ahit("a")

    with override_settings(REDISLUA=dict(django_settings.REDISLUA)):
        pass  # the clients built so far dropped (the sync one's idle connections closed)
    before = int(control.info("clients")["connected_clients"])
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(main())
        gc.collect()
    assert "never retrieved" not in caplog.text
    assert int(control.info("clients")["connected_clients"]) == before


@pytest.mark.django_db
def test_async_view_under_wsgi_builds_no_client_per_request(r: redis.Redis) -> None:
    """Django's sync test client is a WSGI handler: it runs an async view through async_to_sync,
    a new event loop per request. Decisions there use the process-wide pool, not a new client."""
    from django.test import Client

    from django_redislua.connection import _async_clients

    client = Client()
    assert client.get("/rl/async/").status_code == 200  # the pool's connection is made now
    before = int(r.info("stats")["total_connections_received"])
    statuses = [client.get("/rl/async/").status_code for _ in range(10)]
    after = int(r.info("stats")["total_connections_received"])
    assert statuses.count(429) >= 1 and statuses[0] == 200  # still limited: Redis decided
    assert after - before == 0
    assert len(_async_clients) == 0


def test_a_failed_client_build_is_not_retried_for_a_second(monkeypatch) -> None:
    """A dead cluster: discovery fails once, then requests fail fast until the back-off ends."""
    import time

    from django_redislua import connection

    attempts = []
    real_build = connection._build_sync

    def counting_build(endpoint):  # type: ignore[no-untyped-def]
        attempts.append(time.monotonic())
        return real_build(endpoint)

    monkeypatch.setattr(connection, "_build_sync", counting_build)
    with override_settings(REDISLUA={"CONNECTION": "redis+cluster://127.0.0.1:1"}):
        for _ in range(20):
            with pytest.raises(connection.CLIENT_ERRORS):
                get_client()
        assert len(attempts) == 1
        time.sleep(connection.BUILD_BACKOFF)  # then the next request tries again
        with pytest.raises(connection.CLIENT_ERRORS):
            get_client()
        assert len(attempts) == 2


def test_connection_options_sentinel_kwargs_go_to_the_sentinels_in_both_forms(settings) -> None:
    """CONNECTION_OPTIONS["sentinel_kwargs"] reaches the sentinels for a sentinel URL and for
    django-redis's SENTINELS form alike (it used to be passed to the data nodes in the latter)."""
    caches = {**settings.CACHES, "s": {
        "BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://mymaster/0",
        "OPTIONS": {"SENTINELS": [("127.0.0.1", 26379)], "SENTINEL_KWARGS": {"username": "u"}},
    }}
    extra = {"sentinel_kwargs": {"password": "sp"}, "client_name": "web"}
    for connection in ("s", "redis+sentinel://127.0.0.1:26379/mymaster"):
        with override_settings(CACHES=caches,
                               REDISLUA={"CONNECTION": connection, "CONNECTION_OPTIONS": extra}):
            endpoint = resolve_endpoint()
        assert endpoint.kind == "sentinel"
        assert endpoint.sentinel_options["password"] == "sp"
        assert "sentinel_kwargs" not in endpoint.options
        assert endpoint.options["client_name"] == "web"
    assert endpoint.sentinel_options.get("username") is None  # the URL form has no SENTINEL_KWARGS


def test_the_sentinels_are_not_retried_unless_the_user_asks() -> None:
    """Asking the next sentinel is the retry: the connections to the sentinels get none of
    their own (redis-py's default made each dead sentinel cost ~3.5 s; the timing is held by
    tests/test_deployment_docs.py). A "retry" in sentinel_kwargs is the user's choice and
    is kept. Sync and asyncio clients alike."""
    from redis.backoff import ConstantBackoff
    from redis.retry import Retry

    url = "redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster"

    def retries(client: object) -> list[int]:
        manager = client.connection_pool.sentinel_manager  # type: ignore[attr-defined]
        found = [s.get_retry() for s in manager.sentinels]
        # Retry.get_retries() is redis-py 6.3+; older ones keep the count in _retries.
        return [r.get_retries() if hasattr(r, "get_retries") else r._retries for r in found]

    async def async_retries() -> list[int]:
        client = get_async_client()
        try:
            return retries(client)
        finally:
            await aclose_client()

    with override_settings(REDISLUA={"CONNECTION": url}):
        assert retries(get_client()) == [0, 0]
        assert asyncio.run(async_retries()) == [0, 0]
    mine = {"sentinel_kwargs": {"retry": Retry(ConstantBackoff(0.01), 2)}}
    with override_settings(REDISLUA={"CONNECTION": url, "CONNECTION_OPTIONS": mine}):
        assert retries(get_client()) == [2, 2]
