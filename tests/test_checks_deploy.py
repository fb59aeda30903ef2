"""The checks that read the server, run by ``manage.py check --deploy`` only: an evicting
``maxmemory-policy`` (redislua.W006, or the I001 note when it cannot be read), Redis down
(W005). Each test starts the server it reads (a single server, or the 6-node cluster)."""

import pytest
import redis
from django.core.checks import WARNING
from django.test import override_settings


# -- redislua.W006 / I001 (check --deploy only): a maxmemory-policy that evicts --------------
def deploy_messages(connection: str, deploy: bool = True, level: int = 0
                    ) -> list[tuple[str, str]]:
    """(id, message) of this app's checks at ``level`` or above, run as ``check --deploy``
    would (or plain ``check``) with REDISLUA["CONNECTION"] = ``connection``."""
    from django.conf import settings
    from django.core.checks import run_checks

    with override_settings(REDISLUA={**settings.REDISLUA, "CONNECTION": connection,
                                     "SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 2}):
        return [(m.id, m.msg) for m in run_checks(include_deployment_checks=deploy)
                if m.id and m.id.startswith("redislua.") and m.level >= level]


@pytest.fixture(scope="module")
def server():
    from django_redislua.testing import RedisServer

    with RedisServer() as running:
        yield running


@pytest.mark.parametrize(("policy", "says"), [
    ("allkeys-lru", "it can evict any key"),
    ("allkeys-random", "it can evict any key"),
    ("volatile-ttl", "it evicts exactly the keys that have a TTL, and every lock and rate-limit "
                     "key has one"),
    ("volatile-lru", "it evicts exactly the keys that have a TTL"),
])
def test_w006_an_evicting_maxmemory_policy_warns_on_check_deploy(server, policy, says):
    server.client().config_set("maxmemory-policy", policy)
    try:
        [(check_id, message)] = deploy_messages(server.url)
        assert check_id == "redislua.W006"
        assert message.startswith(f"Redis at 127.0.0.1:{server.port} has maxmemory-policy "
                                  f"{policy!r}: under memory pressure {says}")
        assert "An evicted lock is taken by a second holder" in message
        assert deploy_messages(server.url, deploy=False) == []  # plain check: offline, silent
    finally:
        server.client().config_set("maxmemory-policy", "noeviction")
    assert deploy_messages(server.url) == []


def test_w006_hint_says_the_fix():
    from django.conf import settings
    from django.core.checks import run_checks

    from django_redislua.testing import RedisServer

    with RedisServer(extra_args=("--maxmemory-policy", "allkeys-lfu")) as evicting, \
            override_settings(REDISLUA={**settings.REDISLUA, "CONNECTION": evicting.url}):
        [message] = [m for m in run_checks(include_deployment_checks=True)
                     if m.id == "redislua.W006"]
    assert message.hint.startswith("Set maxmemory-policy noeviction on it")
    assert "a Redis of its own with noeviction" in message.hint
    assert message.hint.endswith("checks.html#redislua-w006")


def test_w006_from_info_when_config_is_renamed_away():
    """A managed Redis that refuses CONFIG (here renamed to nothing) still answers INFO."""
    from django_redislua.testing import RedisServer

    with RedisServer(extra_args=("--rename-command", "CONFIG", "",
                                 "--maxmemory-policy", "volatile-lru")) as managed:
        with pytest.raises(redis.ResponseError, match="unknown command"):
            managed.client().config_get("maxmemory-policy")
        [(check_id, message)] = deploy_messages(managed.url)
    assert check_id == "redislua.W006" and "'volatile-lru'" in message


def test_an_acl_user_without_config_or_info_gets_an_info_note():
    from django_redislua.testing import RedisServer

    with RedisServer(extra_args=("--maxmemory-policy", "allkeys-lru")) as server:
        admin = server.client()
        admin.acl_setuser("noconfig", enabled=True, passwords=["+pw1"], keys=["*"],
                          channels=["*"], commands=["+@all", "-config"])
        admin.acl_setuser("neither", enabled=True, passwords=["+pw2"], keys=["*"],
                          channels=["*"], commands=["+@all", "-config", "-info"])
        url = f"redis://{{user}}@127.0.0.1:{server.port}/0"
        [(check_id, message)] = deploy_messages(url.format(user="noconfig:pw1"))
        assert check_id == "redislua.W006" and "'allkeys-lru'" in message  # from INFO
        [(check_id, message)] = deploy_messages(url.format(user="neither:pw2"))
        # A note (INFO): shown, but never a warning that --fail-level WARNING would fail on.
        assert deploy_messages(url.format(user="neither:pw2"), level=WARNING) == []
    assert check_id == "redislua.I001"
    assert message.startswith(f"Could not read the maxmemory-policy of Redis at "
                              f"127.0.0.1:{server.port}: CONFIG GET and INFO are both refused")
    assert "It must be noeviction" in message


def test_redis_down_is_w005_alone():
    from django_redislua.testing import free_port

    found = deploy_messages(f"redis://127.0.0.1:{free_port()}/0")
    assert [check_id for check_id, _ in found] == ["redislua.W005"]


@pytest.mark.cluster
def test_w006_names_each_evicting_primary_of_a_cluster(redis_cluster):
    from django.conf import settings

    from django_redislua.connection import primary_nodes

    with override_settings(REDISLUA={**settings.REDISLUA, "CONNECTION": redis_cluster.url}):
        nodes = primary_nodes()
        assert len(nodes) == 3
        (first, first_client), (second, second_client), (third, _) = sorted(nodes)
        first_client.config_set("maxmemory-policy", "volatile-ttl")
        second_client.config_set("maxmemory-policy", "volatile-ttl")
        try:
            found = deploy_messages(redis_cluster.url)
        finally:
            for _name, client in nodes:
                client.config_set("maxmemory-policy", "noeviction")
    [message] = [message for check_id, message in found if check_id == "redislua.W006"]
    assert message.startswith(f"Redis at {first}, {second} has maxmemory-policy 'volatile-ttl'")
    assert third not in message
    # Only W004 (redis-py < 8: no asyncio cluster pub/sub) may be beside it.
    assert {check_id for check_id, _ in found} <= {"redislua.W006", "redislua.W004"}
    assert [i for i, _ in deploy_messages(redis_cluster.url) if i != "redislua.W004"] == []
