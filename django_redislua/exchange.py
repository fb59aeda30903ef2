"""One exchange on a pooled connection, sent once: checked out, written, read; and what the
installed redis-py offers the transports (feature tests of the internals they read, listed in
docs/versions.md, "Other packages' internals we rely on").

Shared by the sync transports (:mod:`django_redislua.transport`) and the asyncio ones
(:mod:`django_redislua.atransport`). The flags are read as ``exchange.NAME`` where they gate a
path, so a test can take a feature away.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.client
import redis.cluster
import redis.connection
from redis.exceptions import ResponseError

from django_redislua.connection import (
    TORN_DOWN,
    checkout,
    closed_under_us,
    torn_down,
)
from django_redislua.protocol import (
    Command,
    Send,
    unsent,
)

if TYPE_CHECKING:
    pass

T = TypeVar("T")
Connection = Any  # redis-py's connection classes: their send/read methods are untyped
Replies = list[list[Any]]
# Failures of opening a connection: nothing was sent.
OPEN_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)
# redis.asyncio.cluster.RedisCluster has pub/sub from redis-py 8.0; before, a wait there polls
# (docs/locks.md; system check redislua.W004).
ASYNC_CLUSTER_PUBSUB = hasattr(redis.asyncio.cluster.RedisCluster, "pubsub")
POLL_INTERVAL = 0.05  # seconds between two tries of a wait that cannot subscribe


# Feature tests of redis-py internals (docs/versions.md, "Other packages' internals").
def has_async_cluster_pipeline() -> bool:
    """redis-py's asyncio cluster sends one node's commands in one write, never retried, by
    ``ClusterNode.execute_pipeline`` of ``PipelineCommand(position, *args)`` objects, each
    given its ``result``. Its public pipeline retries (a script could run twice)."""
    command = getattr(redis.asyncio.cluster, "PipelineCommand", None)
    node = getattr(redis.asyncio.cluster, "ClusterNode", None)
    if command is None or not inspect.iscoroutinefunction(getattr(node, "execute_pipeline", None)):
        return False
    try:
        return hasattr(command(0, "PING"), "result")
    except TypeError:
        return False


def has_table_refresh() -> bool:
    """redis-py's cluster clients read their slot table again by ``nodes_manager.initialize()``
    (``NodesManager``); no public method does it on demand."""
    return (callable(getattr(redis.cluster.NodesManager, "initialize", None))
            and inspect.iscoroutinefunction(
                getattr(redis.asyncio.cluster.NodesManager, "initialize", None)))


def has_direct_pubsub_read() -> bool:
    """A pub/sub message read straight off ``PubSub.connection`` (:func:`_read_message`):
    ``read_response(disconnect_on_error=False, push_request=True)`` and
    ``PubSub.handle_message``. Without them the lean reads are off (``get_message``)."""
    read = inspect.signature(redis.connection.Connection.read_response).parameters
    return ({"disconnect_on_error", "push_request"} <= read.keys()
            and callable(getattr(redis.client.PubSub, "handle_message", None)))


ASYNC_CLUSTER_PIPELINE = has_async_cluster_pipeline()
TABLE_REFRESH = has_table_refresh()
DIRECT_PUBSUB_READ = has_direct_pubsub_read()


def unsupported(what: str) -> redis.exceptions.RedisClusterException:
    """The clear error where a cluster transport needs a redis-py internal this version lacks:
    a client error, so FAIL_OPEN, LockUnavailable and RecipeUnavailable apply as to a cluster
    that cannot be reached."""
    return redis.exceptions.RedisClusterException(
        f"redis-py {redis.__version__} has no {what}, which django-redislua's cluster transport "
        "needs (docs/versions.md, \"Other packages' internals we rely on\"); use a redis-py "
        "version listed there")


def flatten(op: Send) -> list[Command]:
    return [command for _key, group in op.groups for command in group]


def regroup(op: Send, replies: list[Any]) -> Replies:
    """The replies of :func:`flatten`'s commands, per group of ``op``."""
    split, start = [], 0
    for _key, group in op.groups:
        split.append(replies[start:start + len(group)])
        start += len(group)
    return split


# -- connections, sent once -----------------------------------------------------------------------

class PoolSource:
    """The reference way to a connection: checked out of the pool for one exchange and
    returned after it (redis-py's own path, without its retry)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.take = checkout(pool)
        self.give = pool.release

    @staticmethod
    def write(conn: Connection, commands: Sequence[Command]) -> None:
        if len(commands) == 1:
            conn.send_command(*commands[0])
        else:
            conn.send_packed_command(conn.pack_commands(commands))

    @staticmethod
    def read_one(conn: Connection) -> Any:
        return conn.read_response()

    def close(self) -> None:
        """Nothing is kept between exchanges."""


def opened(source: Any) -> Connection:
    """A connection from ``source``; a failure to open one is marked as sending nothing
    (:func:`protocol.unsent`), a connection torn down by another thread meanwhile included
    (see connection.TORN_DOWN)."""
    try:
        return source.take()
    except OPEN_ERRORS as exc:
        failure = open_failure(exc)
        if failure is exc:
            raise
        raise failure from exc
    except (*TORN_DOWN, ValueError) as exc:  # ValueError: a pool's poll of a socket closed
        # meanwhile (its descriptor -1); nothing is read here, so never a reply's decoding
        if not closed_under_us(exc):
            raise
        raise unsent(torn_down(exc)) from exc


def open_failure(exc: BaseException) -> BaseException:
    """A failure to open a connection (one of OPEN_ERRORS) marked as sending nothing: redis-py's
    errors as they are; a socket's own OSError, which the mark cannot hold (a built-in
    exception has no weak reference), as redis-py's ConnectionError."""
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return unsent(exc)
    return unsent(redis.ConnectionError(f"Error while opening a connection: {exc}"))


def written(source: Any, conn: Connection, commands: Sequence[Command]) -> None:
    """``commands`` sent on ``conn`` in one write, once; a failure closes the connection."""
    try:
        source.write(conn, commands)
    except BaseException as exc:
        conn.disconnect()
        if isinstance(exc, TORN_DOWN) and closed_under_us(exc):
            raise torn_down(exc) from exc
        raise


def read(source: Any, conn: Connection, count: int) -> list[Any]:
    """``count`` replies, an error reply as its exception. Any other failure closes the
    connection: a reply left unread on it must never answer a later call."""
    replies: list[Any] = []
    try:
        for _ in range(count):
            try:
                replies.append(source.read_one(conn))
            except ResponseError as error:
                replies.append(error)
    except BaseException as exc:
        conn.disconnect()
        if isinstance(exc, TORN_DOWN) and closed_under_us(exc):
            raise torn_down(exc) from exc
        raise
    return replies


class Spawned:
    """A protocol running apart (a daemon thread or a task): see :class:`protocol.Spawn`."""

    def __init__(self, runner: Any, stop: threading.Event) -> None:
        self.runner, self.stop = runner, stop

    def task_ended(self) -> Any:
        """An awaitable of the task's end, cancelling it first (it checks its stop event after
        every operation too: a cancellation can be lost). At once from the task itself."""
        if self.runner is asyncio.current_task():
            return asyncio.sleep(0)
        self.runner.cancel()
        return asyncio.wait([self.runner])


def flatten_replies(replies: Replies) -> list[Any]:
    return [reply for group in replies for reply in group]


def first_error(replies: list[Any]) -> None:
    """Raise the first error reply among ``replies``."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
