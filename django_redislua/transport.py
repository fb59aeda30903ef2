"""The transport seam: how the drivers reach Redis, on any redis-py from 5.0.1 to the newest.

A driver (:mod:`django_redislua.drivers`) hands every operation a protocol yields
(:mod:`django_redislua.protocol`) to a transport's ``perform``. A transport sends through
redis-py's public API where it has one: connections checked out of the client's pool
(``get_connection``, ``send_command``/``send_packed_command``, ``read_response``,
``release``), the cluster client's slot table (``get_node_from_key``, ``get_redis_connection``,
``nodes_manager.initialize``), its pub/sub, and ``execute_command`` for plain idempotent
commands. Nothing in redis-py is patched; the few of its internals read (the asyncio cluster's
``PipelineCommand`` and ``ClusterNode.execute_pipeline``, ``nodes_manager``, a pub/sub reply
read with ``push_request=True``) are feature-tested at import and listed in docs/versions.md
("Other packages' internals we rely on").

**Sent once.** A script call goes out on a pooled connection once: redis-py's own retry policy
(which, depending on the version and on how the client was built, sends a command again after
a timeout: up to 10 times on redis-py 8's ``Redis(host=...)`` clients and on every cluster
client) is never in its way. A reply that may have been lost raises, and the connection it was
sent on is closed, so no later call can read that reply. Replies that say the command did not
run are the protocol's to act on (:func:`django_redislua.protocol.call_groups`).

Transports:

- :class:`ServerTransport`: one server (a URL, a cache's pool, Sentinel's current primary).
  Its connection source is the reference (:class:`PoolSource`: checked out of the pool per
  exchange) or, with ``LEAN_CALLS`` on a redis-py the suite proves it on, the lean one
  (:class:`django_redislua.lean.KeptConnections`: some kept checked out between calls).
- :class:`ClusterTransport`: each send goes to the primary the client's slot table names for
  its key, through that node's own :class:`ServerTransport`.
- :class:`ClientTransport`: any other object with ``execute_command`` (its own policies apply).
- The asyncio twins are :mod:`django_redislua.atransport`'s; the connection exchange both use
  (sent once) and the feature tests of redis-py's internals are :mod:`django_redislua.exchange`'s.

``get_transport()`` is the process's, rebuilt when settings change (the one it replaces is
closed: kept connections go back to their pool); ``close()`` closes it on demand; ``run``
runs a protocol on it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.client
import redis.cluster
import redis.connection
from redis.exceptions import ResponseError

from django_redislua import exchange, lean, metrics
from django_redislua.conf import on_change_first
from django_redislua.connection import (
    CLIENT_ERRORS,
    get_client,
)
from django_redislua.drivers import Step, drive, drive_step
from django_redislua.exchange import (
    Connection,
    PoolSource,
    Replies,
    Spawned,
    T,
    flatten,
    opened,
    read,
    regroup,
    unsupported,
    written,
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

# -- sync ----------------------------------------------------------------------------------------

_NOT_READ = object()
_PUBLISHED = (b"message", "message")


def _read_message(pubsub: Any, timeout: float) -> Any:
    """The next message of ``pubsub`` read straight off its connection, as
    ``PubSub.get_message`` gives it, or None when ``timeout`` passes first: a lock's heir reads
    its grant here, on the path between a release and the heir running, without ``get_message``'s
    layers (health check, retry wrapper, observability hooks), which cost about as much as a
    whole round trip. :data:`_NOT_READ` when this way does not apply (a connection that checks its
    health, is not connected, or failed: ``get_message`` then reconnects and resubscribes, as
    it would have)."""
    conn = pubsub.connection
    if conn is None or conn.health_check_interval or not conn.is_connected:
        return _NOT_READ
    try:
        if not conn.can_read(timeout=timeout):
            return None
        response = conn.read_response(disconnect_on_error=False, push_request=True)
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return _NOT_READ
    # A list on RESP2 and RESP3, with either parser (our PubSubs have no push handler).
    if isinstance(response, list) and response and response[0] in _PUBLISHED:
        return {"type": "message", "pattern": None, "channel": response[1], "data": response[2]}
    return pubsub.handle_message(response)  # (un)subscribe confirmations: PubSub keeps count


logger = logging.getLogger("django_redislua")


def in_background(protocol: Protocol[Any], transport: Transport, name: str) -> None:
    """Run a spawned ``protocol`` (a give-back, a renewal) to its end. Nobody waits for it, so
    a failure of its own is logged, never raised into the thread (a traceback on stderr from
    ``threading.excepthook``, and nothing in the app's logs): what it gives back expires by
    itself."""
    try:
        drive(protocol, transport)
    except Exception:
        logger.warning("%s failed; what it was giving back expires by itself", name,
                       exc_info=True)


class Transport:
    """What the sync driver performs: Redis operations (subclasses) and the ones that need no
    Redis (pauses, application calls, protocols run apart)."""

    client: Any
    # Pub/sub messages read straight off the connection (see _read_message): where calls are
    # lean too (a plain pool, LEAN_CALLS, a redis-py the suite proves it on).
    lean_reads = False

    def __init__(self) -> None:
        self.operations: dict[type, Callable[[Any], Any]] = {
            Call: self.perform_call, Send: self.send, Load: self.load, Refresh: self.refresh,
            Clustered: self.clustered, Execute: self.execute, Pause: self.pause,
            Now: self.now, Failed: self.failed,
            Subscribe: self.subscribe, Listen: self.listen, Unsubscribe: self.unsubscribe,
            Inbox: self.inbox, Invoke: self.invoke, Spawn: self.spawn, Join: self.join,
        }
        self._local = threading.local()

    def clustered(self, op: Clustered) -> bool:
        return isinstance(self.client, redis.cluster.RedisCluster)

    def perform(self, operation: Any) -> Any:
        return self.operations[type(operation)](operation)

    def perform_call(self, op: Call) -> Any:
        return self.call(op.script, op.command)

    def call(self, script: LuaScript, command: Command) -> Any:
        """One script call's reply; an error reply raises (see :class:`protocol.Call`)."""
        return drive(call(script, command), self)

    def send(self, op: Send) -> Replies:
        raise NotImplementedError

    def load(self, op: Load) -> None:
        reply = self.send(Send(((None, (op.command,)),)))[0][0]
        if isinstance(reply, Exception):
            raise reply

    def refresh(self, op: Refresh) -> bool:
        return False

    def execute(self, op: Execute) -> Any:
        return self.client.execute_command(*op.args)

    def close(self) -> None:
        """Give back what this transport keeps (lean connections, this thread's pub/sub)."""
        self.drop_subscriber()

    # pub/sub: one connection per thread, kept from one wait to the next (subscribing and
    # unsubscribing per wait): a wait then pays no connect and handshake before it.
    def subscribe(self, op: Subscribe) -> Any:
        pubsub = getattr(self._local, "pubsub", None)
        if pubsub is None:
            pubsub = self._local.pubsub = self.client.pubsub()
        try:
            pubsub.subscribe(op.channel)
        except BaseException:
            self.drop_subscriber()
            raise
        return pubsub

    def inbox(self, op: Inbox) -> Mailbox:
        """This thread's inbox: ``<prefix><random token>``, subscribed on the thread's pub/sub
        connection at its first wait and kept (only hand-offs to this thread's own waits are
        published to it, so nothing piles up between waits)."""
        box: Mailbox | None = getattr(self._local, "inbox", None)
        if (box is not None and box.channel.startswith(op.prefix)
                and box.subscription is getattr(self._local, "pubsub", None)):
            return box
        token = secrets.token_hex(16)
        channel = f"{op.prefix}{token}"
        subscribed = self.subscribe(Subscribe(channel))
        # Confirmed by the first wait (it reads the confirmation); later waits need not.
        self._local.inbox = box = Mailbox(subscribed, channel, token, confirmed=False, kept=True)
        return box

    def listen(self, op: Listen) -> Any:
        pubsub = op.subscription
        try:
            if self.lean_reads:
                message = _read_message(pubsub, op.timeout)
                if message is not _NOT_READ:
                    return message
            return pubsub.get_message(timeout=op.timeout)
        except BaseException:
            self.drop_subscriber()  # interrupted mid-read: the connection's state is unknown
            raise

    def unsubscribe(self, op: Unsubscribe) -> None:
        pubsub = getattr(self._local, "pubsub", None)
        if pubsub is None or op.subscription is not pubsub:
            return  # dropped already (a read was interrupted): nothing to unsubscribe
        try:
            # The confirmation is read, and skipped, by this thread's next wait.
            pubsub.unsubscribe(op.channel)
        except BaseException:
            self.drop_subscriber()
            raise

    def drop_subscriber(self) -> None:
        """Close this thread's kept pub/sub connection (a thread about to end may call it)."""
        pubsub = getattr(self._local, "pubsub", None)
        self._local.pubsub = self._local.inbox = None
        if pubsub is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                pubsub.close()

    # what needs no Redis
    @staticmethod
    def pause(op: Pause) -> None:
        if op.wake is None:
            time.sleep(op.seconds)
        else:
            op.wake.wait(op.seconds)

    @staticmethod
    def now(op: Now) -> float:
        return time.monotonic()

    @staticmethod
    def failed(op: Failed) -> None:
        metrics.redis_error(op.operation)

    @staticmethod
    def invoke(op: Invoke) -> Any:
        return op.sync(*op.args)

    def spawn(self, op: Spawn) -> Spawned:
        thread = threading.Thread(target=in_background, args=(op.protocol, self, op.name),
                                  name=op.name, daemon=True)
        thread.start()
        return Spawned(thread, op.stop)

    @staticmethod
    def join(op: Join) -> None:
        spawned: Spawned = op.spawned
        spawned.stop.set()
        if spawned.runner is not threading.current_thread():
            spawned.runner.join()


class ServerTransport(Transport):
    """One server: every group of a send goes out in one write on one connection."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__()
        self.client = client
        pool = client.connection_pool
        lean_calls = lean.eligible(pool)
        self.lean_reads = lean_calls and exchange.DIRECT_PUBSUB_READ
        self.source: Any = lean.KeptConnections(pool) if lean_calls else PoolSource(pool)

    def send(self, op: Send) -> Replies:
        commands = flatten(op)
        source = self.source
        conn = opened(source)
        try:
            written(source, conn, commands)
            return regroup(op, read(source, conn, len(commands)))
        finally:
            source.give(conn)

    def reply(self, command: Command) -> Any:
        """One command sent once, its reply (an error reply as its exception)."""
        source = self.source
        conn = opened(source)
        try:
            written(source, conn, (command,))
            return read(source, conn, 1)[0]
        finally:
            source.give(conn)

    def call(self, script: LuaScript, command: Command) -> Any:
        """The hot path of a decision: one exchange; the protocol's way only when the script
        is missing there (then it is loaded and the call sent again)."""
        try:
            reply = self.reply(command)
        except CLIENT_ERRORS:
            metrics.redis_error(script.name)
            raise
        if isinstance(reply, ResponseError):
            if missing(reply):
                return drive(call(script, command, loaded_first=True), self)
            metrics.redis_error(script.name)
            raise reply
        return reply

    def close(self) -> None:
        super().close()
        self.source.close()


class ClusterTransport(Transport):
    """A cluster: each group goes to the primary the client's slot table names for its key,
    through that node's pool; every group is written before any reply is read."""

    def __init__(self, cluster: redis.cluster.RedisCluster) -> None:
        super().__init__()
        if not (exchange.TABLE_REFRESH and hasattr(cluster, "nodes_manager")):
            raise unsupported("cluster NodesManager.initialize (nodes_manager)")
        self.client = cluster
        self._nodes: dict[str, ServerTransport] = {}
        self._lock = threading.Lock()

    def node(self, key: Any = None, address: tuple[str, int] | None = None) -> ServerTransport:
        """The transport of the primary holding ``key`` (or at ``address``); when the slot
        table cannot say, nothing is sent (read the table again)."""
        cluster = self.client
        try:
            found = (cluster.get_node_from_key(key) if address is None
                     else cluster.get_node(host=address[0], port=address[1]))
        except redis.exceptions.SlotNotCoveredError as exc:
            unsent(exc)
            raise
        if found is None:
            raise unsent(redis.exceptions.ClusterError(f"no cluster node at {address}"))
        client = cluster.get_redis_connection(found)
        transport = self._nodes.get(found.name)
        if transport is None or transport.client is not client:
            with self._lock:
                stale = self._nodes.get(found.name)
                transport = self._nodes[found.name] = ServerTransport(client)
            if stale is not None:
                stale.close()
        return transport

    def send(self, op: Send) -> Replies:
        """Each node's groups in one write on one connection of its pool. Every connection is
        opened before anything is written, so a failure to open one sent nothing."""
        by_node: dict[ServerTransport, list[int]] = {}
        for n, (key, _group) in enumerate(op.groups):
            by_node.setdefault(self.node(key, op.address), []).append(n)
        plan = [(target.source, [c for n in members for c in op.groups[n][1]], members)
                for target, members in by_node.items()]
        taken: list[tuple[Any, Connection]] = []
        settled = 0  # how many of ``taken`` have had every reply read
        try:
            for source, _commands, _members in plan:
                taken.append((source, opened(source)))
            for (source, conn), (_source, commands, _members) in zip(taken, plan, strict=True):
                written(source, conn, commands)
            replies: Replies = [[] for _ in op.groups]
            for (source, conn), (_s, commands, members) in zip(taken, plan, strict=True):
                flat, start = read(source, conn, len(commands)), 0
                settled += 1
                for n in members:
                    replies[n] = flat[start:start + len(op.groups[n][1])]
                    start += len(op.groups[n][1])
            return replies
        finally:
            for n, (source, conn) in enumerate(taken):
                if n >= settled:
                    # Its replies may still come: unread, one would answer the next call sent
                    # on this connection (the pool's check only sees a reply already there).
                    conn.disconnect()
                source.give(conn)

    def load(self, op: Load) -> None:
        """On every primary, each in one exchange."""
        for node in self.primaries():
            reply = self.node(address=(node.host, node.port)).send(Send(((None, (op.command,)),)))
            if isinstance(reply[0][0], Exception):
                raise reply[0][0]

    def primaries(self) -> list[Any]:
        # get_nodes() copies redis-py's node table in one step (see connection.primary_nodes)
        return [n for n in self.client.get_nodes() if n.server_type == redis.cluster.PRIMARY]

    def refresh(self, op: Refresh) -> bool:
        table_changing(self.client.nodes_manager.initialize, again=True)
        return True

    def execute(self, op: Execute) -> Any:
        return table_changing(lambda: self.client.execute_command(*op.args))

    def close(self) -> None:
        super().close()
        with self._lock:
            nodes, self._nodes = list(self._nodes.values()), {}
        for transport in nodes:
            transport.close()


def table_changing(read: Callable[[], T], again: bool = False) -> T:
    """``read()``, a redis-py cluster call that iterates the client's node table. While a node
    fails, redis-py reorders that table from other threads without the lock its readers take
    (``NodesManager.move_node_to_end_of_cached_nodes``; redis/redis-py#3803 locked the readers
    in 7.2 but not this writer, up to 8.1 at least; valkey-io/valkey-py#332 is the same race),
    so the read can raise RuntimeError ("dictionary changed size during iteration"). It is
    tried once more (``again``), then raised as a ClusterError, a Redis failure like any other
    (FAIL_OPEN, LockUnavailable), never a bare RuntimeError. tests/test_failover_cluster.py
    makes the interleaving certain."""
    try:
        return read()
    except RuntimeError as exc:
        if again:
            return table_changing(read)
        raise redis.exceptions.ClusterError(
            f"redis-py's cluster node table changed while it was read ({exc})") from exc


class ClientTransport(Transport):
    """Any other client object: each command through its ``execute_command`` (its own routing
    and retry policy apply), for instance a test's transactional wrapper of a real client."""

    def __init__(self, client: Any) -> None:
        super().__init__()
        self.client = client

    def send(self, op: Send) -> Replies:
        replies = []
        for _key, group in op.groups:
            answered: list[Any] = []
            for command in group:
                try:
                    answered.append(self.client.execute_command(*command))
                except ResponseError as error:
                    answered.append(error)
            replies.append(answered)
        return replies


def transport_for(client: Any) -> Transport:
    """A transport for ``client``: a redis-py client's pools, or any ``execute_command``."""
    if isinstance(client, redis.cluster.RedisCluster):
        return ClusterTransport(client)
    if isinstance(client, redis.Redis):
        return ServerTransport(client)
    return ClientTransport(client)


# -- the process's transports ----------------------------------------------------------------------

_lock = threading.Lock()
_sync: Transport | None = None
_pid = os.getpid()


def get_transport() -> Transport:
    """The process's sync transport (built from ``REDISLUA["CONNECTION"]`` on first use)."""
    found = _sync
    if found is None or _pid != os.getpid():
        found = _built()
    return found


def _built() -> Transport:
    global _sync, _pid
    with _lock:
        if _pid != os.getpid():  # a forked child: the parent's kept connections are not ours
            _sync, _pid = None, os.getpid()
        if _sync is None:
            _sync = transport_for(get_client())
        return _sync


class Unbuilt(Transport):
    """The process's transport while its client cannot be built (a malformed setting, no
    cluster node answering; ``connection.get_client`` backs off between tries): every Redis
    operation tries again and raises the failure where the protocol waits for it, so the
    protocol's own error handling (FAIL_OPEN, LockUnavailable, RecipeUnavailable) applies."""

    client = None

    def perform(self, operation: Any) -> Any:
        if type(operation) in REDIS_OPERATIONS:
            return get_transport().perform(operation)
        return super().perform(operation)

    def call(self, script: LuaScript, command: Command) -> Any:
        return get_transport().call(script, command)


REDIS_OPERATIONS = frozenset({Call, Send, Load, Refresh, Clustered, Execute, Subscribe, Inbox,
                              Listen, Unsubscribe})


_UNBUILT = Unbuilt()


def current() -> Transport:
    """The process's sync transport, or :class:`Unbuilt` while its client cannot be built."""
    try:
        return get_transport()
    except CLIENT_ERRORS:
        return _UNBUILT


def run(protocol: Protocol[T]) -> T:
    """Run ``protocol`` on the process's sync transport."""
    return drive(protocol, current())


def run_step(step: Step) -> Any:
    return drive_step(step, current())


@on_change_first
def close() -> None:
    """Close the process's sync transport (settings changed; or call it before exiting): kept
    connections go back to their pools. The next call builds it anew."""
    global _sync
    with _lock:
        dropped, _sync = _sync, None
    if dropped is not None:
        dropped.close()
