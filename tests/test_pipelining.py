"""Automatic pipelining (django_redislua/pipelining.py) on a real server: what holds for one
call holds for calls that share a write. Many asyncio tasks racing for a limit admit exactly the
limit, every algorithm; their calls reach Redis in a few reads (counted by the server), each one
command; replies lost with a batch are each applied once and never sent again; tasks cancelled
in a batch leave nothing held while their batch-mates get their own replies.

The tests marked ``topologies`` run on the single server and again on the 6-node cluster,
where each primary has a shared connection of its own (a batch per node); the lost-reply and
cancellation tests of tests/test_lost_replies.py run their asyncio calls on the single server's
too, alone in their batch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.cluster
from django.test import override_settings

from django_redislua import Policy, pipelining
from django_redislua.atransport import AsyncClusterTransport, get_async_transport
from django_redislua.connection import CLIENT_ERRORS, get_client, primary_nodes
from django_redislua.recipes import CappedCounter, RecipeUnavailable
from django_redislua.testing import CommandRecorder
from tests.settings import REDISLUA
from tests.test_lean_path import paused
from tests.test_locks_fair import auntil


@pytest.fixture(autouse=True)
def pipelining_on() -> Iterator[None]:
    """PIPELINING on for this module's tests, whatever the settings' default."""
    with override_settings(REDISLUA={**REDISLUA, "PIPELINING": True}):
        yield


ALGORITHMS = ["fixed_window", "sliding_window", "sliding_log", "token_bucket", "leaky_bucket",
              "gcra"]
TASKS = 64


def shared() -> pipelining.SharedConnection:
    """The running loop's shared connection (asserted: the path under test is taken)."""
    found = get_async_transport().shared  # type: ignore[attr-defined]
    assert isinstance(found, pipelining.SharedConnection)
    return found


def shared_connections() -> list[pipelining.SharedConnection]:
    """The running loop's shared connections: the server's, or one per primary of a cluster
    that has been called (asserted: the path under test is taken)."""
    transport = get_async_transport()
    if isinstance(transport, AsyncClusterTransport):
        found = list(transport.node_connections.values())
        assert found and all(isinstance(c, pipelining.SharedConnection) for c in found)
        return found
    return [shared()]


def batched() -> bool:
    """Whether this topology's asyncio calls share connections here: a cluster's nodes only on
    redis-py 6.4 and newer (before, each call goes out as its node's pipeline)."""
    return pipelining.NODE_RELEASE or not isinstance(get_client(), redis.cluster.RedisCluster)


def needs_batches() -> None:
    if not batched():
        pytest.skip(f"redis-py {redis.__version__}: a cluster's calls are not batched")


def in_flight() -> int:
    return sum(len(connection._in_flight) for connection in shared_connections())


def writing() -> bool:
    return any(connection._writing for connection in shared_connections())


def reads_processed() -> int:
    """The servers' count of reads from client sockets (INFO stats, every primary): one per
    socket read, however many commands it brought."""
    return sum(int(client.info("stats")["total_reads_processed"])
               for _name, client in primary_nodes())


def server_pid() -> int:
    return int(get_client().info("server")["process_id"])


async def closed_by_the_server(conn: Any) -> None:
    """Until the server's close of ``conn`` (an idle timeout, ``CLIENT KILL``) has reached its
    socket, as it has between two requests: asyncio's transport reads the EOF as it comes."""
    await auntil(lambda: conn._reader is not None and conn._reader.at_eof(),
                 what="the server's close to reach the socket")


@contextlib.contextmanager
def primaries_paused() -> Iterator[None]:
    """Every primary stopped (SIGSTOP) for the block (see tests/test_lean_path.paused). On the
    cluster, all at once: no majority is left to fail one over."""
    with contextlib.ExitStack() as stack:
        for _name, client in primary_nodes():
            stack.enter_context(paused(int(client.info("server")["process_id"])))
        yield


@pytest.mark.topologies
@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_64_racing_tasks_admit_exactly_the_limit(algorithm: str) -> None:
    options: dict[str, Any] = {"burst": 10} if algorithm in ("token_bucket", "leaky_bucket",
                                                             "gcra") else {}
    policy = Policy(f"race-{algorithm}", rate="10/h", algorithm=algorithm, **options)
    await policy.apeek("warm")  # the script loaded and the connection open: only the race below
    before = reads_processed()
    decisions = await asyncio.gather(*(policy.ahit("k") for _ in range(TASKS)))
    reads = reads_processed() - before
    assert sum(decision.allowed for decision in decisions) == 10
    assert {d.remaining for d in decisions if not d.allowed} == {0}
    assert (await policy.apeek("k")).remaining == 0
    if batched():  # the 64 calls shared their writes: far fewer reads than calls (one each)
        assert reads <= TASKS // 4, reads
        shared_connections()


@pytest.mark.topologies
async def test_a_concurrency_limit_raced_by_64_tasks_holds_exactly_its_slots() -> None:
    policy = Policy("race-slots", algorithm="concurrency", limit=10, timeout="10m")
    decisions = await asyncio.gather(*(policy.ahit("k") for _ in range(TASKS)))
    held = [decision for decision in decisions if decision.allowed]
    assert len(held) == 10 and len({d.lease for d in held}) == 10
    key = policy.redis_key("k")
    assert get_client().zcard(key) == 10
    await asyncio.gather(*(policy.arelease("k", d) for d in held))
    assert get_client().zcard(key) == 0


@pytest.mark.topologies
async def test_each_decision_is_one_command_whatever_shares_its_write() -> None:
    policy = Policy("one-each", rate="1000/h", algorithm="gcra")
    await policy.apeek("warm")
    with CommandRecorder(get_client()) as recorder:
        decisions = await asyncio.gather(*(policy.ahit(f"user{n}") for n in range(TASKS)))
    assert all(decision.allowed and decision.remaining == 999 for decision in decisions)
    if batched():
        # no PING, no handshake, nothing sent twice
        assert recorder.commands == ["EVALSHA"] * TASKS
        shared_connections()
    else:  # each call on a connection it opens: their handshakes (CLIENT SETINFO), no more
        assert [c for c in recorder.commands if c != "CLIENT"] == ["EVALSHA"] * TASKS


@pytest.fixture
def short_timeouts() -> Iterator[None]:
    with override_settings(REDISLUA={**REDISLUA, "PIPELINING": True, "SOCKET_TIMEOUT": 0.4,
                                     "SOCKET_CONNECT_TIMEOUT": 0.4}):
        yield


@pytest.mark.topologies
async def test_replies_lost_with_their_batch_are_each_applied_once(
        short_timeouts: None) -> None:
    needs_batches()
    policy = Policy("lost-batch", rate="100/h", algorithm="fixed_window")
    counter = CappedCounter("lost-batch", cap=100, ttl="1h")
    assert (await policy.ahit("warm")).allowed and (await counter.aadd("warm")).accepted
    # Stopped until every call of the batch has given up on its reply (the 0.4 s socket
    # timeout); what was written waits in the socket and runs when the server resumes.
    with primaries_paused():
        hits = [asyncio.ensure_future(policy.ahit(f"user{n}")) for n in range(8)]
        adds = [asyncio.ensure_future(counter.aadd(f"item{n}")) for n in range(4)]
        outcomes = await asyncio.gather(*hits, *adds, return_exceptions=True)
    assert all(isinstance(outcome, (*CLIENT_ERRORS, RecipeUnavailable))
               for outcome in outcomes), outcomes

    def applied() -> tuple[list[int], list[int]]:
        return ([100 - policy.peek(f"user{n}").remaining for n in range(8)],
                [counter.value(f"item{n}") for n in range(4)])

    await auntil(lambda: applied() == ([1] * 8, [1] * 4),  # the server ran what waited
                 what="the lost calls to run")
    # ...once: nothing was sent again, then or with the next calls.
    assert (await policy.ahit("user0")).remaining == 98
    assert applied() == ([2] + [1] * 7, [1] * 4)


async def test_a_reader_task_given_no_reply_times_its_batch_out_each_applied_once(
        short_timeouts: None) -> None:
    # The batch's replies are read by a reader task (its first caller, alone, is cancelled
    # while reading and hands the reading over): on redis-py 8.1 it keeps the socket timeout
    # with a timer of its own (direct.Deadline), before with redis-py's per read. Either
    # way the calls fail as timed out while the server is still stopped.
    policy = Policy("deadline-batch", rate="100/h", algorithm="fixed_window")
    assert (await policy.ahit("warm")).allowed
    connection = shared()
    with paused(server_pid()):
        first = asyncio.ensure_future(policy.ahit("user0"))  # alone: it reads its own reply
        rest = [asyncio.ensure_future(policy.ahit(f"user{n}")) for n in range(1, 8)]
        await auntil(lambda: len(connection._in_flight) == 8 and not connection._writing,
                     what="the 8 calls to be written")
        first.cancel()
        await auntil(lambda: connection._reader is not None and not connection._reader.done(),
                     what="a reader task to take the reading over")
        # A bound against hanging, not a timing: the server stays stopped meanwhile.
        outcomes = await asyncio.wait_for(asyncio.gather(*rest, return_exceptions=True), 60)
    assert all(isinstance(outcome, redis.TimeoutError) for outcome in outcomes), outcomes
    with pytest.raises(asyncio.CancelledError):
        await first

    def applied() -> list[int]:
        return [100 - policy.peek(f"user{n}").remaining for n in range(8)]

    await auntil(lambda: applied() == [1] * 8, what="the written calls to run")
    assert (await policy.ahit("user1")).remaining == 98  # once: nothing was sent again


async def test_a_call_alone_given_no_reply_times_out_applied_once(short_timeouts: None) -> None:
    # A call alone reads its own reply in its caller's task: on redis-py 8.1 the shared
    # connection's timer closes the socket when the reply is late (it never cancels that task);
    # before, redis-py's own timer on the read. The caller gets a timeout, not a cancellation.
    policy = Policy("deadline-alone", rate="100/h", algorithm="fixed_window")
    assert (await policy.ahit("warm")).allowed
    cancellations: list[int] = []

    async def solo() -> Any:
        try:
            return await policy.ahit("solo")
        finally:
            task = asyncio.current_task()
            assert task is not None
            cancellations.append(task.cancelling())  # the caller's task: never cancelled

    with paused(server_pid()):
        # A bound against hanging, not a timing: the server stays stopped meanwhile.
        call = asyncio.ensure_future(solo())
        done, _ = await asyncio.wait([call], timeout=60)
    assert done and isinstance(call.exception(), redis.TimeoutError), call
    assert cancellations == [0]
    await auntil(lambda: 100 - policy.peek("solo").remaining == 1, what="the written call to run")
    assert (await policy.ahit("solo")).remaining == 98  # once: it was not sent again


@pytest.mark.topologies
async def test_tasks_cancelled_in_a_batch_leave_no_slot_and_the_others_get_their_own() -> None:
    needs_batches()
    policy = Policy("cancel-batch", algorithm="concurrency", limit=10, timeout="10m")
    gauge = Policy("cancel-batch-gauge", rate="100/h", algorithm="fixed_window")
    await policy.apeek("warm")
    await asyncio.gather(*(gauge.apeek(f"user{n}") for n in range(3)))  # every node's script
    key = policy.redis_key("k")
    with primaries_paused():  # until the cancellations are made: none can be answered first
        slots = [asyncio.ensure_future(policy.ahit("k")) for _ in range(6)]
        hits = [asyncio.ensure_future(gauge.ahit(f"user{n}")) for n in range(3)]
        await auntil(lambda: in_flight() == 9 and not writing(),
                     what="the 9 calls to be written")
        for task in slots[:3]:
            task.cancel()  # their futures too, at once: their replies will be dropped
    kept = await asyncio.gather(*slots[3:])
    counted = await asyncio.gather(*hits)
    for task in slots[:3]:
        with pytest.raises(asyncio.CancelledError):
            await task
    assert all(decision.allowed and decision.lease for decision in kept)
    assert [decision.remaining for decision in counted] == [99, 99, 99]  # each its own reply
    await auntil(lambda: get_client().zcard(key) == 3,  # the cancelled gave back what they took
                 what="the cancelled calls' slots to be given back")
    await asyncio.gather(*(policy.arelease("k", decision) for decision in kept))
    assert get_client().zcard(key) == 0


async def test_a_connection_the_server_closed_while_idle_is_replaced_before_the_next_batch(
        ) -> None:
    policy = Policy("closed-idle", rate="100/h", algorithm="gcra", burst=100)
    assert (await policy.ahit("a")).allowed
    closed = shared()._conn
    get_client().client_kill_filter(_type="normal", skipme=True)  # an idle timeout, say
    await closed_by_the_server(closed)
    decisions = await asyncio.gather(*(policy.ahit("a") for _ in range(8)))
    assert sorted(d.remaining for d in decisions) == list(range(91, 99))  # none lost, none twice
    assert shared()._conn is closed and closed.is_connected  # reconnected before the write


def test_pipelining_is_on_by_default_and_false_takes_a_connection_per_call() -> None:
    async def transport_shared() -> Any:
        return get_async_transport().shared  # type: ignore[attr-defined]

    assert isinstance(asyncio.run(transport_shared()), pipelining.SharedConnection)
    with override_settings(REDISLUA={**REDISLUA, "PIPELINING": False}):
        assert asyncio.run(transport_shared()) is None
    with override_settings(REDISLUA={**REDISLUA, "PIPELINING": None}):  # redislua.E024
        assert asyncio.run(transport_shared()) is None
    with override_settings(REDISLUA={k: v for k, v in REDISLUA.items() if k != "PIPELINING"}):
        assert isinstance(asyncio.run(transport_shared()),  # on unless turned off
                          pipelining.SharedConnection)


def test_a_pool_of_one_connection_is_not_shared() -> None:
    async def transport_shared() -> Any:
        return get_async_transport().shared  # type: ignore[attr-defined]

    options = {"max_connections": 1}
    with override_settings(REDISLUA={**REDISLUA, "PIPELINING": True,
                                     "CONNECTION_OPTIONS": options}):
        assert asyncio.run(transport_shared()) is None


def test_a_redis_error_reply_reaches_only_its_caller() -> None:
    """An error reply in the middle of a batch (a script's own error) is its caller's; the
    batch-mates on either side get their replies."""
    async def main() -> list[Any]:
        exchange = shared().exchange
        return await asyncio.gather(
            exchange([("SET", "pl:a", "1")]), exchange([("INCR", "pl:text-not-int")]),
            exchange([("GET", "pl:a")]), return_exceptions=True)

    get_client().set("pl:text-not-int", "text")
    first, error, last = asyncio.run(main())
    assert first == [True] or first == [b"OK"] or first == ["OK"]
    assert isinstance(error[0], redis.ResponseError)
    assert last == [b"1"] or last == ["1"]


async def test_settings_changes_close_the_shared_connections_they_drop() -> None:
    """Each settings change drops the loop's transport and its client: the shared connection
    goes with the client's pool, and the server's connection count stays bounded."""
    policy = Policy("pl-churn", rate="5/m", algorithm="gcra")

    def connected() -> int:
        return int(get_client().info("clients")["connected_clients"])

    before = None
    for round_ in range(60):
        with override_settings(REDISLUA={**REDISLUA, "PIPELINING": True,
                                         "KEY_PREFIX": f"plchurn{round_}"}):
            assert (await asyncio.gather(policy.ahit("k"), policy.ahit("k")))[1].allowed
            shared()
            if round_ == 5:
                before = await asyncio.to_thread(connected)
        await asyncio.sleep(0)  # a dropped client closes on this loop
    assert before is not None
    await auntil(lambda: connected() <= before + 2, what="the dropped clients to close")


# -- a cluster: a shared connection per primary ----------------------------------------------------


@pytest.fixture
def on_cluster(redis_cluster: Any) -> Iterator[Any]:
    if not pipelining.NODE_RELEASE:
        pytest.skip(f"redis-py {redis.__version__}: a cluster's calls are not batched")
    with override_settings(REDISLUA={**REDISLUA, "CONNECTION": redis_cluster.url,
                                     "PIPELINING": True}):
        for _name, node in primary_nodes():
            node.flushall()
            node.script_flush()
        yield get_client()


def node_stats(section: str, field: str) -> dict[str, int]:
    return {name: int(client.info(section)[field]) for name, client in primary_nodes()}


def cluster_transport() -> AsyncClusterTransport:
    transport = get_async_transport()
    assert isinstance(transport, AsyncClusterTransport)
    return transport


@pytest.mark.cluster
async def test_a_cluster_batches_per_node_on_one_connection_each(on_cluster: Any) -> None:
    policy = Policy("per-node", rate="10/h", algorithm="gcra", burst=10)
    identities = [f"user{n}" for n in range(TASKS)]
    owners = {name: [i for i in identities
                     if on_cluster.get_node_from_key(policy.redis_key(i)).name == name]
              for name, _client in primary_nodes()}
    assert all(len(mine) >= 8 for mine in owners.values()), owners  # spread over every node
    await asyncio.gather(*(policy.apeek(mine[0]) for mine in owners.values()))  # warm: open
    connections = node_stats("stats", "total_connections_received")
    reads = node_stats("stats", "total_reads_processed")
    decisions = await asyncio.gather(*(policy.ahit(i) for i in identities))
    assert all(d.allowed and d.remaining == 9 for d in decisions)
    # No connection opened: each node's calls went out on its one shared connection...
    assert node_stats("stats", "total_connections_received") == connections
    assert len(cluster_transport().node_connections) == len(owners)
    # ...in a few writes each (a read per call, unshared).
    after = node_stats("stats", "total_reads_processed")
    for name, mine in owners.items():
        assert after[name] - reads[name] <= len(mine) // 4, (name, len(mine), after, reads)


@pytest.mark.cluster
async def test_a_moved_reply_in_a_batch_retries_only_its_calls_once_each(
        on_cluster: Any) -> None:
    policy = Policy("moved-batch", rate="10/h", algorithm="fixed_window")
    identities = [f"user{n}" for n in range(TASKS)]
    await asyncio.gather(*(policy.ahit(i) for i in identities))  # scripts loaded, connections open
    client = get_async_transport().client
    stale = client.keyslot(policy.redis_key(identities[0]))
    moved = [i for i in identities if client.keyslot(policy.redis_key(i)) == stale]
    owner = client.nodes_manager.slots_cache[stale][0]
    other = next(n for n in client.get_primaries() if n.name != owner.name)
    client.nodes_manager.slots_cache[stale] = [other]  # stale: as after a resharding
    decisions = await asyncio.gather(*(policy.ahit(i) for i in identities))
    assert [d.remaining for d in decisions] == [8] * TASKS  # each counted once, moved or not
    assert client.nodes_manager.get_node_from_slot(stale).name == owner.name  # table read again
    assert moved and len(moved) < TASKS


@pytest.mark.cluster
@pytest.mark.parametrize("read_by", ["the transport", "redis-py"])
async def test_a_node_gone_from_the_table_has_its_shared_connection_closed(
        on_cluster: Any, read_by: str) -> None:
    """redis-py builds a new node object for a node it did not know (one that left the table
    and came back; before 8.1, every node at each read of the table): the old object's shared
    connection is closed and given back once idle, and the node's calls go on a new one. The
    table read again by the transport (after a MOVED) retires it at once; by redis-py itself
    (its own commands' redirects), at the node's next call."""
    from django_redislua.protocol import Refresh

    policy = Policy("node-gone", rate="100/h", algorithm="fixed_window")
    assert (await policy.ahit("k")).allowed
    transport = cluster_transport()
    client = transport.client
    node = client.get_node_from_key(policy.redis_key("k"))
    old = transport.node_connections[node.name]
    conn = old._conn
    assert conn is not None and conn.is_connected
    del client.nodes_manager.nodes_cache[node.name]  # the table no longer names it
    if read_by == "the transport":
        assert await transport.refresh(Refresh())  # read again: a new object for the same node
        await auntil(lambda: not conn.is_connected, what="the old node's connection to close")
        assert old._conn is None
    else:
        await client.nodes_manager.initialize()
    assert client.get_node(node_name=node.name) is not node
    assert (await policy.ahit("k")).remaining == 98  # on the new node's shared connection
    await auntil(lambda: not conn.is_connected, what="the old node's connection to close")
    assert old._conn is None
    assert transport.node_connections[node.name] is not old
    await node.disconnect()  # its other connections (none open: the old object is dropped)


@pytest.mark.cluster
async def test_checks_on_two_slots_of_one_node_share_its_connection_after_a_reconnect(
        on_cluster: Any) -> None:
    """One decision over two identities whose slots are on one node: its send makes both
    groups' exchanges before either is awaited. With the node's connection closed by the server
    meanwhile (an idle timeout), only one of them may check and reopen it (two readers of one
    socket is an error of asyncio's); the other goes out behind it."""
    from django_redislua.limiting import aevaluate

    policy = Policy("two-slots", rate="5/m", algorithm="fixed_window")
    by_node: dict[str, list[str]] = {}
    for n in range(200):
        identity = f"u{n}"
        key = policy.redis_key(identity)
        by_node.setdefault(on_cluster.get_node_from_key(key).name, []).append(identity)
    name, mine = next((name, ids) for name, ids in by_node.items() if len(ids) >= 2)
    first, second = mine[0], next(i for i in mine[1:] if on_cluster.keyslot(policy.redis_key(i))
                                  != on_cluster.keyslot(policy.redis_key(mine[0])))
    pair = [(policy, first, 1), (policy, second, 1)]
    assert [d.remaining for d in await aevaluate(pair)] == [4, 4]
    node = next(client for node_name, client in primary_nodes() if node_name == name)
    node.client_kill_filter(_type="normal", skipme=True)
    await closed_by_the_server(cluster_transport().node_connections[name]._conn)
    assert [d.remaining for d in await aevaluate(pair)] == [3, 3]
    assert len(cluster_transport().node_connections) == 1
