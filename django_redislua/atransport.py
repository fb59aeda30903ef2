"""The asyncio transports: the twins of :mod:`django_redislua.transport`'s, for the asyncio
driver, and :class:`ThrowawayLoopTransport` for an async view under WSGI (the sync transport,
inline). ``get_async_transport()`` is the running loop's, closed with that loop's client;
``arun`` runs a protocol on it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import secrets
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.client
import redis.cluster
import redis.connection
from redis.exceptions import ResponseError

from django_redislua import exchange, lean, metrics, pipelining
from django_redislua.conf import on_change_first
from django_redislua.connection import (
    CLIENT_ERRORS,
    checkout,
    get_async_client,
    on_throwaway_loop,
)
from django_redislua.drivers import Step, adrive, adrive_step, keep_running
from django_redislua.exchange import (
    OPEN_ERRORS,
    Connection,
    Replies,
    Spawned,
    T,
    first_error,
    flatten,
    flatten_replies,
    open_failure,
    regroup,
    unsupported,
)
from django_redislua.protocol import (
    Call,
    Clustered,
    Command,
    Execute,
    Failed,
    Inbox,
    Invoke,
    Join,
    Listen,
    Load,
    LuaScript,
    Mailbox,
    Now,
    Pause,
    Protocol,
    Refresh,
    Send,
    Spawn,
    Subscribe,
    Unsubscribe,
    call,
    missing,
    unsent,
)
from django_redislua.transport import (
    REDIS_OPERATIONS,
    Transport,
    get_transport,
)

# -- asyncio -------------------------------------------------------------------------------------

logger = logging.getLogger("django_redislua")


async def in_background(protocol: Protocol[Any], transport: AsyncTransport, name: str) -> None:
    """The asyncio twin of :func:`django_redislua.transport.in_background`: a spawned
    protocol's own failure is logged, not left in a task nobody awaits."""
    try:
        await adrive(protocol, transport)
    except Exception:
        logger.warning("%s failed; what it was giving back expires by itself", name,
                       exc_info=True)


class AsyncTransport:
    """What the asyncio driver performs: each method returns an awaitable."""

    client: Any

    def __init__(self) -> None:
        self.operations: dict[type, Callable[[Any], Any]] = {
            Call: self.perform_call, Send: self.send, Load: self.load, Refresh: self.refresh,
            Clustered: self.clustered, Execute: self.execute, Pause: self.pause,
            Now: self.now, Failed: self.failed,
            Subscribe: self.subscribe, Listen: self.listen, Unsubscribe: self.unsubscribe,
            Inbox: self.inbox, Invoke: self.invoke, Spawn: self.spawn, Join: self.join,
        }

    def perform(self, operation: Any) -> Any:
        return self.operations[type(operation)](operation)

    async def clustered(self, op: Clustered) -> bool:
        return isinstance(self.client, redis.asyncio.cluster.RedisCluster)

    def perform_call(self, op: Call) -> Any:
        return adrive(call(op.script, op.command), self)

    def call(self, script: LuaScript, command: Command) -> Any:
        return adrive(call(script, command), self)

    def send(self, op: Send) -> Any:
        raise NotImplementedError

    async def load(self, op: Load) -> None:
        first_error(await self.loaded(op))

    def loaded(self, op: Load) -> Any:
        """The load's reply on every primary (an awaitable of a list)."""
        return aexchange(self.source, (op.command,))  # type: ignore[attr-defined]

    async def refresh(self, op: Refresh) -> bool:
        return False

    def execute(self, op: Execute) -> Any:
        return self.client.execute_command(*op.args)

    # pub/sub: a subscription of its own per wait, closed by Unsubscribe
    async def subscribe(self, op: Subscribe) -> Any:
        pubsub = self.client.pubsub()
        await pubsub.subscribe(op.channel)
        return pubsub

    async def inbox(self, op: Inbox) -> Mailbox:
        """An inbox for this wait alone (no kept one: a pub/sub connection per wait), in one
        ``SUBSCRIBE`` with the primitive's own channel, so the wait is counted among the
        channel's subscribers (``PUBSUB NUMSUB``) like any other; only the inbox is listened
        to."""
        token = secrets.token_hex(16)
        channel = f"{op.prefix}{token}"
        pubsub = self.client.pubsub()
        await pubsub.subscribe(op.channel, channel)
        return Mailbox(pubsub, channel, token, False)

    @staticmethod
    def listen(op: Listen) -> Any:
        return op.subscription.get_message(timeout=op.timeout)

    @staticmethod
    def unsubscribe(op: Unsubscribe) -> Any:
        return op.subscription.aclose()

    @staticmethod
    def pause(op: Pause) -> Any:
        return asyncio.sleep(op.seconds)

    @staticmethod
    async def now(op: Now) -> float:
        return time.monotonic()

    @staticmethod
    async def failed(op: Failed) -> None:
        metrics.redis_error(op.operation)

    @staticmethod
    def invoke(op: Invoke) -> Any:
        result = (op.asynchronous or op.sync)(*op.args)
        return result if inspect.isawaitable(result) else _given(result)

    async def spawn(self, op: Spawn) -> Spawned:
        task = asyncio.get_running_loop().create_task(
            in_background(op.protocol, self, op.name))
        keep_running(task)
        return Spawned(task, op.stop)

    @staticmethod
    def join(op: Join) -> Any:
        spawned: Spawned = op.spawned
        spawned.stop.set()
        return spawned.task_ended()


async def _given(value: Any) -> Any:
    """``value`` as an awaitable (a sync callable's result, for the driver to await)."""
    return value


async def aexchange(source: Any, commands: Sequence[Command]) -> list[Any]:
    """The asyncio :func:`opened`, :func:`written` and :func:`read`: ``commands`` sent once in
    one write on a connection of ``source``, their replies (an error reply as its exception).
    A failure or a cancellation while sending or reading closes the connection (redis-py's
    ``send_packed_command`` and ``read_response`` do), and it goes back to ``source``."""
    try:
        conn = await source.take()
    except OPEN_ERRORS as exc:
        failure = open_failure(exc)
        if failure is exc:
            raise
        raise failure from exc
    try:
        await conn.send_packed_command(source.pack(conn, commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(await conn.read_response())
            except ResponseError as error:
                replies.append(error)
        return replies
    finally:
        given = source.give(conn)
        if given is not None:  # shielded: a second cancellation must not lose the connection
            await asyncio.shield(given)


class AsyncPoolSource:
    """The reference asyncio way to a connection: from the pool, per exchange."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.take = checkout(pool)
        self.give = pool.release

    @staticmethod
    def pack(conn: Connection, commands: Sequence[Command]) -> Any:
        return conn.pack_commands(commands)


class AsyncServerTransport(AsyncTransport):
    """The asyncio twin of :class:`ServerTransport`."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        super().__init__()
        self.client = client
        pool = client.connection_pool
        self.source: Any = (lean.AsyncKeptConnections(pool) if lean.eligible(pool)
                            else AsyncPoolSource(pool))
        self.shared = pipelining.SharedConnection(pool) if pipelining.eligible(pool) else None

    async def send(self, op: Send) -> Replies:
        return regroup(op, await self.exchanged(flatten(op)))

    def exchanged(self, commands: list[Command]) -> Any:
        """The replies of ``commands`` to await: on the shared connection (pipelining) unless
        one blocks, else on a connection of their own."""
        if self.shared is not None and pipelining.shares(commands):
            return self.shared.exchange(commands)
        return aexchange(self.source, commands)

    def loaded(self, op: Load) -> Any:
        # With pipelining, on the shared connection the calls that need the script go on.
        return self.exchanged([op.command])

    async def call(self, script: LuaScript, command: Command) -> Any:
        """The hot path of a decision, the twin of :meth:`ServerTransport.call`: one exchange
        (shared with the loop's other calls when pipelining); the protocol's way only when the
        script is missing there. A single server has no redirect to follow nor a table to
        refresh, so this is what :func:`protocol.call` does here, without its generators
        (about a fifth of an asyncio decision's client CPU with 64 in flight)."""
        try:
            reply = (await self.exchanged([command]))[0]
        except CLIENT_ERRORS:
            metrics.redis_error(script.name)
            raise
        if isinstance(reply, ResponseError):
            if missing(reply):
                return await adrive(call(script, command, loaded_first=True), self)
            metrics.redis_error(script.name)
            raise reply
        return reply

    def perform_call(self, op: Call) -> Any:
        return self.call(op.script, op.command)


class AsyncClusterTransport(AsyncTransport):
    """The asyncio twin of :class:`ClusterTransport`: each group goes to its node, nodes
    concurrently, sent once. With pipelining, on the node's shared connection (the groups of
    every task in flight to that node share its writes and reads); else, and for a blocking
    command, by the node's own ``execute_pipeline`` (one write on one connection)."""

    def __init__(self, cluster: redis.asyncio.cluster.RedisCluster) -> None:
        super().__init__()
        if not exchange.ASYNC_CLUSTER_PIPELINE:
            raise unsupported("asyncio cluster PipelineCommand / ClusterNode.execute_pipeline")
        if not (exchange.TABLE_REFRESH and hasattr(cluster, "nodes_manager")):
            raise unsupported("cluster NodesManager.initialize (nodes_manager)")
        self.client = cluster
        self.node_connections: dict[str, pipelining.SharedConnection] = {}  # by node name
        if not exchange.ASYNC_CLUSTER_PUBSUB:
            self.operations.update({Subscribe: self.poll, Listen: self.polled,
                                    Unsubscribe: self.unpolled, Inbox: self.poll_inbox})

    async def send(self, op: Send) -> Replies:
        await self.client.initialize()  # a new client discovers the cluster before routing
        return await self.exchanged(self.targets(op))

    def exchanged(self, targets: list[tuple[Any, tuple[Command, ...]]]
                  ) -> Awaitable[Replies]:
        """The replies of each group at its node, to await: on the nodes' shared connections
        (pipelining) unless a command blocks, else each as its node's pipeline."""
        if all(pipelining.shares(group) for _node, group in targets):
            shared = [self.node_connection(node) for node, _group in targets]
            if None not in shared:
                return pipelining.gathered(
                    [connection.exchange(group)  # type: ignore[union-attr]
                     for connection, (_node, group) in zip(shared, targets, strict=True)])
        return self.pipelined([(node, pipeline(group)) for node, group in targets])

    async def pipelined(self, pipelines: list[tuple[Any, list[Any]]]) -> Replies:
        await asyncio.gather(*self.sent(pipelines))
        return self.results(pipelines)

    def node_connection(self, node: Any) -> pipelining.SharedConnection | None:
        """``node``'s shared connection (None: pipelining is off for it). A node object new
        under a known name (redis-py before 8.1 builds new ones when it reads the table)
        retires the old one's."""
        found = self.node_connections.get(node.name)
        if found is not None and found.pool.node is node:
            return found
        if not pipelining.node_eligible(node):
            return None
        if found is not None:
            found.retire()
        found = pipelining.SharedConnection(pipelining.NodePool(node))
        self.node_connections[node.name] = found
        return found

    def _retire_stale(self) -> None:
        """The shared connections of nodes no longer in the table are closed (once idle)."""
        for name, shared in list(self.node_connections.items()):
            if self.client.get_node(node_name=name) is not shared.pool.node:
                del self.node_connections[name]
                shared.retire()

    @staticmethod
    def sent(pipelines: list[tuple[Any, list[Any]]]) -> list[Any]:
        """Each node's ``execute_pipeline`` of its commands: one write, never retried."""
        return [node.execute_pipeline(commands) for node, commands in pipelines]

    @staticmethod
    def results(pipelines: list[tuple[Any, list[Any]]]) -> Replies:
        return [[command.result for command in commands] for _node, commands in pipelines]

    def targets(self, op: Send) -> list[tuple[Any, tuple[Command, ...]]]:
        """Each group and the node it goes to."""
        cluster, found = self.client, []
        for key, group in op.groups:
            try:
                node = (cluster.get_node_from_key(key) if op.address is None
                        else cluster.get_node(host=op.address[0], port=op.address[1]))
            except redis.exceptions.SlotNotCoveredError as exc:
                unsent(exc)
                raise
            if node is None:
                raise unsent(redis.exceptions.ClusterError(f"no cluster node at {op.address}"))
            found.append((node, group))
        return found

    async def loaded(self, op: Load) -> list[Any]:
        await self.client.initialize()
        return flatten_replies(await self.pipelined(self.everywhere(op)))

    def everywhere(self, op: Load) -> list[tuple[Any, list[Any]]]:
        """The load as a one-command pipeline for every primary."""
        return [(node, pipeline((op.command,)))
                for node in self.client.get_nodes() if node.server_type == "primary"]

    async def refresh(self, op: Refresh) -> bool:
        await self.client.nodes_manager.initialize()
        self._retire_stale()
        return True

    # redis-py before 8.0 has no asyncio cluster pub/sub: a wait there wakes every
    # POLL_INTERVAL instead of on a message (redislua.W004).
    @staticmethod
    def poll(op: Subscribe) -> Any:
        return asyncio.sleep(0, Polling(op.channel))

    @staticmethod
    def poll_inbox(op: Inbox) -> Any:
        return asyncio.sleep(0, Mailbox(Polling(op.channel), op.channel, "", False))

    @staticmethod
    def polled(op: Listen) -> Any:
        return op.subscription.listen(op.timeout)

    @staticmethod
    def unpolled(op: Unsubscribe) -> Any:
        return asyncio.sleep(0)


def pipeline(group: Sequence[Command]) -> list[Any]:
    """``group`` as the commands of a node's ``execute_pipeline``."""
    from redis.asyncio.cluster import PipelineCommand

    return [PipelineCommand(i, *command) for i, command in enumerate(group)]


class Polling:
    """A subscription where there can be none (see ``exchange.ASYNC_CLUSTER_PUBSUB``):
    confirmed at once, then every ``POLL_INTERVAL`` reads as a wake-up message, so the wait
    tries again."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.confirmed = False

    def listen(self, timeout: float) -> Any:
        if not self.confirmed:
            self.confirmed = True
            return asyncio.sleep(0, {"type": "subscribe", "channel": self.channel, "data": 1})
        return asyncio.sleep(min(timeout, exchange.POLL_INTERVAL),
                             {"type": "message", "channel": self.channel, "data": "poll"})


class ThrowawayLoopTransport(AsyncTransport):
    """An async view under WSGI runs in a loop made for one call (see
    ``connection.on_throwaway_loop``): every Redis operation runs on the process's sync
    transport, inline, blocking only that private loop, so no connection is opened per
    request."""

    def __init__(self, sync: Transport) -> None:
        super().__init__()
        self.client = sync.client
        self.sync = sync
        for kind in (Call, Send, Load, Refresh, Clustered, Execute, Subscribe, Inbox, Listen,
                     Unsubscribe):
            self.operations[kind] = self.inline

    def inline(self, operation: Any) -> Any:
        return asyncio.sleep(0, self.sync.perform(operation))


def async_transport_for(client: Any) -> AsyncTransport:
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        return AsyncClusterTransport(client)
    return AsyncServerTransport(client)


# -- the running loop's transports -----------------------------------------------------------------

_lock = threading.Lock()
_async: weakref.WeakKeyDictionary[Any, AsyncTransport] = weakref.WeakKeyDictionary()
_throwaway: tuple[Transport | None, ThrowawayLoopTransport | None] = (None, None)


def get_async_transport() -> AsyncTransport:
    """The running loop's asyncio transport (the sync one, inline, on a throwaway loop)."""
    global _throwaway
    if on_throwaway_loop():
        sync = get_transport()
        known, inline = _throwaway
        if known is not sync or inline is None:
            inline = ThrowawayLoopTransport(sync)
            _throwaway = (sync, inline)
        return inline
    client = get_async_client()
    found = _async.get(client)
    if found is None:
        found = _async[client] = async_transport_for(client)
    return found


class AsyncUnbuilt(AsyncTransport):
    """The asyncio twin of :class:`Unbuilt`."""

    client = None

    def perform(self, operation: Any) -> Any:
        if type(operation) in REDIS_OPERATIONS:
            return get_async_transport().perform(operation)
        return super().perform(operation)

    def call(self, script: LuaScript, command: Command) -> Any:
        return get_async_transport().call(script, command)


def acurrent() -> AsyncTransport:
    """The running loop's asyncio transport, or :class:`AsyncUnbuilt`."""
    try:
        return get_async_transport()
    except CLIENT_ERRORS:
        return AsyncUnbuilt()


async def arun(protocol: Protocol[T]) -> T:
    """Run ``protocol`` on the running loop's asyncio transport (found when awaited)."""
    return await adrive(protocol, acurrent())


async def arun_step(step: Step) -> Any:
    return await adrive_step(step, acurrent())


@on_change_first
def close() -> None:
    """Forget the loops' asyncio transports (settings changed): their clients are closed on
    their loops (``connection.reset_clients``); the next call builds them anew."""
    global _throwaway
    with _lock:
        _throwaway = (None, None)
        _async.clear()
