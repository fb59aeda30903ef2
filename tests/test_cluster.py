"""The engine and the script registry on a real 6-node Redis Cluster and behind a real Sentinel."""

import pytest
from django.test import override_settings

from django_redislua import Policy
from django_redislua.connection import get_client, primary_nodes
from django_redislua.limiting import evaluate
from django_redislua.scripts import get_script
from django_redislua.testing import RedisSentinelServers

pytestmark = pytest.mark.cluster


@pytest.fixture
def on_cluster(redis_cluster):
    with override_settings(REDISLUA={"CONNECTION": redis_cluster.url}):
        get_client().flushall()
        for _node, client in primary_nodes():
            client.script_flush()
        yield get_client()


def test_hit_on_a_cluster_loads_the_script_where_the_key_lives(on_cluster):
    policy = Policy("c", rate="3/m", algorithm="gcra")
    results = [policy.hit(f"user{i % 7}").allowed for i in range(40)]
    assert results.count(True) == 7 * 3


def test_multi_policy_for_one_identity_is_one_slot_and_all_or_nothing(on_cluster):
    burst = Policy("burst", rate="2/m", algorithm="fixed_window")
    sustained = Policy("sustained", rate="100/h", algorithm="sliding_window")
    keys = {burst.redis_key("u1"), sustained.redis_key("u1")}
    assert len({on_cluster.keyslot(k) for k in keys}) == 1
    assert all(d.allowed for d in evaluate([(burst, "u1", 1), (sustained, "u1", 1)]))
    assert all(d.allowed for d in evaluate([(burst, "u1", 1), (sustained, "u1", 1)]))
    third = evaluate([(burst, "u1", 1), (sustained, "u1", 1)])
    assert [d.allowed for d in third] == [False, True]
    assert sustained.peek("u1").remaining == 98  # the denied request took nothing


def test_checks_on_different_slots_are_decided_slot_by_slot(on_cluster):
    a = Policy("a", rate="1/m", algorithm="fixed_window")
    slots = {on_cluster.keyslot(a.redis_key(i)) for i in ("x", "y", "z")}
    assert len(slots) > 1
    decisions = evaluate([(a, "x", 1), (a, "y", 1), (a, "z", 1)])
    assert [d.key for d in decisions] == ["x", "y", "z"] and all(decisions)


def test_sentinel_url_follows_the_primary():
    with RedisSentinelServers() as servers, override_settings(REDISLUA={"CONNECTION": servers.url}):
        policy = Policy("s", rate="2/m", algorithm="sliding_log")
        assert [policy.hit("k").allowed for _ in range(3)] == [True, True, False]
        assert servers.primary.client().exists(policy.redis_key("k")) == 1


def test_locks_on_a_cluster_are_fenced_listed_on_every_primary_and_released(on_cluster):
    from django_redislua.locks import Lock, Semaphore
    from django_redislua.locks.inspect import force_release, scan_locks

    held = [Lock(f"job:{i}", timeout=30) for i in range(12)]
    for lock in held:
        assert lock.acquire(blocking=False)
    assert len({on_cluster.keyslot(f"x{{{lock.name}}}") for lock in held}) > 3

    found: dict[str, int | None] = {}
    cursor = 0
    for _ in range(1000):  # bounded: every primary, page by page
        cursor, page = scan_locks(cursor, count=100)
        found.update({info.name: info.fencing_token for info in page})
        if cursor == 0:
            break
    assert sorted(found) == sorted(lock.name for lock in held)

    again = Lock("job:0", timeout=30)
    assert not again.acquire(blocking=False)
    assert force_release("job:0")
    assert again.acquire(blocking=False) and again.token > held[0].token
    again.release()
    for lock in held[1:]:
        lock.release()

    permits = Semaphore("exports", limit=2, timeout=30)
    assert permits.acquire(blocking=False) and permits.acquire(blocking=False)
    assert not permits.acquire(blocking=False)


def _evalsha_calls(client) -> dict[str, int]:
    return {name: node.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
            for name, node in primary_nodes(client)}


def test_checks_on_several_slots_are_one_call_per_slot_pipelined(on_cluster):
    """Three identities on three primaries: each primary receives exactly one EVALSHA (one
    call for its slot), sent in one pipeline; a primary that lost the script (SCRIPT FLUSH
    on it alone) gets it loaded and its call sent again, and the others are not called twice."""
    a = Policy("spread", rate="1/m", algorithm="fixed_window")
    nodes = {name: node for name, node in primary_nodes()}
    by_node: dict[str, str] = {}
    for i in range(200):  # bounded: find one identity per primary
        identity = f"id{i}"
        node = on_cluster.get_node_from_key(a.redis_key(identity)).name
        by_node.setdefault(node, identity)
        if len(by_node) == len(nodes):
            break
    identities = list(by_node.values())
    assert len(identities) == 3
    for _name, node in primary_nodes():
        node.script_load(get_script("django_redislua.ratelimit").source)
        node.config_resetstat()
    next(iter(nodes.values())).script_flush()  # one primary lost it (a restart, a new node)

    decisions = evaluate([(a, identity, 1) for identity in identities])

    assert [d.allowed for d in decisions] == [True, True, True]
    calls = _evalsha_calls(on_cluster)
    flushed = next(iter(nodes))
    assert calls == {name: (2 if name == flushed else 1) for name in nodes}
    assert not any(d.allowed for d in evaluate([(a, identity, 1) for identity in identities]))


async def test_async_checks_on_several_slots_are_decided_per_slot(on_cluster):
    from django_redislua.limiting import aevaluate

    a = Policy("aspread", rate="1/m", algorithm="fixed_window")
    identities = [f"u{i}" for i in range(12)]
    assert len({on_cluster.keyslot(a.redis_key(i)) for i in identities}) > 3
    first = await aevaluate([(a, identity, 1) for identity in identities])
    again = await aevaluate([(a, identity, 1) for identity in identities])
    assert all(first) and not any(again)


def test_preload_loads_every_primary_and_every_replica(on_cluster, redis_cluster):
    """The script cache is not replicated: preload loads the replicas too, so a replica
    promoted by a failover has the scripts; --check and redislua_status list every node."""
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("redislua_preload", stdout=out)
    lines = out.getvalue().splitlines()
    replicas = []
    for server in redis_cluster.servers:
        with server.client() as client:
            if client.info("replication")["role"] == "slave":
                replicas.append(server)
    assert len(replicas) == 3
    for server in replicas:
        assert any(f"127.0.0.1:{server.port} (replica of" in line and line.endswith("loaded")
                   for line in lines), (server.port, lines)
        with server.client() as client:
            assert all(client.script_exists(get_script("django_redislua.ratelimit_fw").sha))
    check = StringIO()
    call_command("redislua_preload", "--check", stdout=check)  # exit 0: nothing missing
    assert check.getvalue().count("present") == len(lines)
    status = StringIO()
    call_command("redislua_status", "--no-keys", stdout=status)
    assert status.getvalue().count("(replica of") == len(lines) // 2


def test_preload_functions_reports_the_library_on_every_replica(on_cluster):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("redislua_preload", "--functions", stdout=out)
    rows = [line for line in out.getvalue().splitlines() if "(replica of" in line]
    assert len(rows) == 3 and all(row.endswith("present") for row in rows)


def test_a_decision_goes_straight_to_its_primary_and_follows_a_moved_reply(
        on_cluster, monkeypatch):
    """A single-slot call goes to the lean connections of the primary the client's slot table
    names, never through RedisCluster.execute_command (whose retry would send a script again
    after a lost reply). With that table stale (the slot pointed at another primary, as after
    a resharding or a failover), the primary asked answers MOVED: the table is read again and
    the call sent to the owner, where it runs once."""
    from django_redislua import lean
    from django_redislua.transport import PoolSource, get_transport

    policy = Policy("straight", rate="5/m", algorithm="fixed_window")
    policy.hit("warm")  # the script loaded on every primary
    dispatched: list[tuple[object, ...]] = []
    ordinary = on_cluster.execute_command

    def counted(*args, **kwargs):
        dispatched.append(args)
        return ordinary(*args, **kwargs)

    monkeypatch.setattr(on_cluster, "execute_command", counted)
    assert [policy.hit("u1").remaining for _ in range(3)] == [4, 3, 2]
    assert dispatched == []
    slot = on_cluster.keyslot(policy.redis_key("u1"))
    owner = on_cluster.nodes_manager.get_node_from_slot(slot)
    transport = get_transport()
    assert transport.node(policy.redis_key("u1")).client is owner.redis_connection
    source = transport.node(policy.redis_key("u1")).source
    assert isinstance(source, lean.KeptConnections if lean.SUPPORTED else PoolSource)

    other = next(n for n in on_cluster.get_primaries() if n.name != owner.name)
    on_cluster.nodes_manager.slots_cache[slot] = [other]  # stale: the slot "belongs" to other
    before = sum(_evalsha_calls(on_cluster).values())
    assert policy.hit("u1").remaining == 1  # counted once: the MOVED call did not run
    assert dispatched == []  # followed by the transport, never redis-py's retrying dispatch
    assert sum(_evalsha_calls(on_cluster).values()) - before == 1
    assert on_cluster.nodes_manager.get_node_from_slot(slot).name == owner.name  # table fixed
    assert policy.hit("u1").remaining == 0 and dispatched == []  # straight again
