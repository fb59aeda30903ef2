"""Lua scripts as package data: discovered, called by SHA, reloaded once on NOSCRIPT.

Every installed app may ship scripts in ``<app>/redislua/*.lua``; each is registered as
``"<app_label>.<file stem>"``. Files in ``<app>/redislua/lib/`` are fragments, not scripts: a
script pulls one in with a line ``--#include lib/name.lua``, so an algorithm written once can be
composed into several scripts. Every file starts with a comment stating its KEYS and ARGV. A
line ``--#per-call`` splits a script in two: as a Function, what is above it (the functions it
defines) runs once when the library loads and only what is below runs per call; ``EVALSHA``
runs the whole script every call.

Calls go by ``EVALSHA``; when the server answers ``NOSCRIPT`` (restart, ``SCRIPT FLUSH``, a new
node) the script is loaded and the call retried, once. With ``REDISLUA["USE_FUNCTIONS"]`` the
scripts are called as Redis 7 Functions (``FCALL``) from one versioned library instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import redis
import redis.asyncio.cluster
from django.apps import apps
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)

from django_redislua import conf, metrics
from django_redislua.conf import settings
from django_redislua.connection import (
    CLIENT_ERRORS,
    AsyncClient,
    SyncClient,
    discovered,
    get_async_client,
    get_client,
)
from django_redislua.lean import async_channel_for, channel_for

# What makes a cluster call leave the lean path for redis-py's: see Script._run_on_cluster.
REROUTED = (MovedError, AskError, TryAgainError, ClusterDownError, SlotNotCoveredError,
            redis.ConnectionError, redis.TimeoutError)
INCLUDE = re.compile(r"^--#include\s+(\S+)\s*$", re.MULTILINE)
# In a Functions library, a script's code above this line runs once, when the library loads.
PER_CALL = "\n--#per-call\n"


def _has_header(source: str) -> bool:
    """True when the file's leading comment block names both KEYS and ARGV."""
    lines = []
    for line in source.lstrip().splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    head = "\n".join(lines)
    return "KEYS" in head and "ARGV" in head


LIBRARY_PREFIX = "redislua_"

KeyArg = str | bytes
Arg = str | bytes | int | float


class ScriptError(Exception):
    """A script file is malformed (missing include, no KEYS/ARGV header, unknown name)."""


def _expand(path: Path, root: Path, seen: tuple[Path, ...] = ()) -> str:
    if path in seen:
        raise ScriptError(f"{path}: include cycle through {', '.join(map(str, seen))}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScriptError(f"cannot read Lua file {path}: {exc}") from exc

    def include(match: re.Match[str]) -> str:
        target = (root / match.group(1)).resolve()
        if root.resolve() not in target.parents:
            raise ScriptError(f"{path}: include {match.group(1)!r} leaves {root}")
        return _expand(target, root, (*seen, path))

    return INCLUDE.sub(include, text)


class Script:
    """One registered script. Call it like a function: ``script(keys=[...], args=[...])``."""

    def __init__(self, name: str, source: str, path: Path | None = None) -> None:
        self.name = name
        self.source = source
        self.path = path
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        self.function_name = LIBRARY_PREFIX + re.sub(r"\W", "_", name)
        self._head: tuple[int, tuple[str, str]] = (-1, ("", ""))

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:12]}>"

    def __call__(
        self,
        keys: Sequence[KeyArg] = (),
        args: Sequence[Arg] = (),
        client: SyncClient | None = None,
    ) -> Any:
        return self.run((*self.head(), len(keys), *keys, *args), client)

    async def acall(
        self,
        keys: Sequence[KeyArg] = (),
        args: Sequence[Arg] = (),
        client: AsyncClient | None = None,
    ) -> Any:
        return await self.arun((*self.head(), len(keys), *keys, *args), client)

    def head(self) -> tuple[str, str]:
        """``("EVALSHA", sha)`` or ``("FCALL", function)``: a call is this, then the number of
        keys, the keys and the arguments. Cached per settings (it depends on USE_FUNCTIONS)."""
        cached = self._head
        if cached[0] != conf.generation:
            head = (("FCALL", function_name(self, registry.library()[0])) if settings.USE_FUNCTIONS
                    else ("EVALSHA", self.sha))
            cached = self._head = (conf.generation, head)
        return cached[1]

    def run(self, command: tuple[Any, ...], client: SyncClient | None = None) -> Any:
        """Send ``command`` (:meth:`head` + number of keys, keys, args); on ``NOSCRIPT`` load
        the script and send it again, once."""
        try:
            client = client or get_client()
            channel = channel_for(client)
            if channel is not None:
                return self._exchange(channel.call, command)
            if type(client) is RedisCluster and command[2]:
                return self._run_on_cluster(client, command)
            return self._exchange(client.execute_command, command)
        except CLIENT_ERRORS:
            metrics.redis_error(self.name)
            raise

    def _exchange(self, send: Any, command: tuple[Any, ...], load_with: Any = None) -> Any:
        """``send(*command)``; when the script is missing, it is loaded (by ``load_with``, if
        given) and the command sent again, once."""
        try:
            return send(*command)
        except ResponseError as exc:
            load = self._load_command(exc)
            if load is None:
                raise
        (load_with or send)(*load)
        return send(*command)

    def _run_on_cluster(self, cluster: RedisCluster, command: tuple[Any, ...]) -> Any:
        """:meth:`run` on a cluster: straight to the lean channel of the primary the client's
        slot table names for the first key (redis-py's cluster dispatch costs about twice the
        client CPU of the call itself). A redirect, a node that is down or not answering, a
        slot the table lacks: the call goes the ordinary way instead, where redis-py follows
        the redirect, refreshes its table and retries, as it would have. None of those replies
        means the script ran, except a timeout, which redis-py's own retry resends too."""
        try:
            primary = cluster.nodes_manager.get_node_from_slot(
                cluster.keyslot(command[3])).redis_connection
            channel = None if primary is None else channel_for(primary)
            if channel is not None:
                # A script missing there is missing on every primary, most likely (a restart of
                # all, SCRIPT FLUSH, a deploy): loaded through the cluster client, on them all.
                return self._exchange(channel.call, command, cluster.execute_command)
        except REROUTED:
            pass
        return self._exchange(cluster.execute_command, command)

    async def arun(self, command: tuple[Any, ...], client: AsyncClient | None = None) -> Any:
        """The asyncio twin of :meth:`run`."""
        try:
            client = client or get_async_client()
            channel = async_channel_for(client)
            # Only a client off the lean path can be a cluster, which must be discovered first.
            send = (await discovered(client)).execute_command if channel is None else channel.call
            try:
                return await send(*command)
            except ResponseError as exc:
                load = self._load_command(exc)
                if load is None:
                    raise
            await send(*load)
            return await send(*command)
        except CLIENT_ERRORS:
            metrics.redis_error(self.name)
            raise

    def run_all(self, commands: Sequence[tuple[Any, ...]],
                client: SyncClient | None = None) -> list[Any]:
        """Several calls (see :meth:`run`), pipelined: on a cluster each node gets its share,
        written to every node before any reply is read, so the calls overlap (one round trip per
        node, taken together). Calls the server lacks the script for are loaded and sent
        again, once; any other error is raised (after every call was answered)."""
        if len(commands) == 1:
            return [self.run(commands[0], client)]
        client = client or get_client()
        try:
            replies = self._pipelined(client, commands)
            missing, load = self._reload(replies)
            if missing:
                cast(Any, client).execute_command(*load)  # a cluster: on every node
                again = self._pipelined(client, [commands[i] for i in missing])
                return self._raised(replies, missing, again)
            return self._raised(replies)
        except CLIENT_ERRORS:
            metrics.redis_error(self.name)
            raise

    async def arun_all(self, commands: Sequence[tuple[Any, ...]],
                       client: AsyncClient | None = None) -> list[Any]:
        """The asyncio twin of :meth:`run_all` (redis-py sends each node its share
        concurrently)."""
        if len(commands) == 1:
            return [await self.arun(commands[0], client)]
        client = client or await discovered(get_async_client())
        try:
            replies = await self._apipelined(client, commands)
            missing, load = self._reload(replies)
            if missing:
                await client.execute_command(*load)
                again = await self._apipelined(client, [commands[i] for i in missing])
                return self._raised(replies, missing, again)
            return self._raised(replies)
        except CLIENT_ERRORS:
            metrics.redis_error(self.name)
            raise

    @staticmethod
    def _pipelined(client: SyncClient, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(pipe.execute(raise_on_error=False))

    @staticmethod
    async def _apipelined(client: AsyncClient,
                          commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute(raise_on_error=False))

    def _reload(self, replies: list[Any]) -> tuple[list[int], tuple[Any, ...]]:
        """The calls of a pipeline that found the script missing, and what loads it."""
        missing = [i for i, reply in enumerate(replies) if self._missing(reply)]
        if not missing:
            return [], ()
        load = self._load_command(replies[missing[0]])
        assert load is not None  # _missing holds for exactly what _load_command loads
        return missing, load

    @staticmethod
    def _raised(replies: list[Any], resent: Sequence[int] = (),
                again: Sequence[Any] = ()) -> list[Any]:
        """``replies``, those of the ``resent`` calls replaced by ``again``; the first error
        among them raised."""
        for i, reply in zip(resent, again, strict=True):
            replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def _load_command(self, error: ResponseError) -> tuple[Any, ...] | None:
        """What loads the script a call just found missing (``SCRIPT LOAD``, or ``FUNCTION LOAD
        REPLACE`` of the library), or None when ``error`` is something else."""
        if isinstance(error, NoScriptError):
            return ("SCRIPT LOAD", self.source)
        if settings.USE_FUNCTIONS and _is_missing_function(error):
            return ("FUNCTION LOAD", "REPLACE", registry.library()[1])
        return None

    # -- followed by WAIT, for writes that must reach replicas before they count --------------

    def _queue(self, pipe: Any, keys: Sequence[KeyArg], args: Sequence[Arg], replicas: int,
               timeout_ms: int) -> None:
        pipe.execute_command(*self.head(), len(keys), *keys, *args)
        pipe.execute_command("WAIT", replicas, timeout_ms)

    def _missing(self, reply: Any) -> bool:
        return isinstance(reply, NoScriptError) or (
            isinstance(reply, ResponseError) and _is_missing_function(reply))

    @staticmethod
    def _replicated(reply: Any, acked: Any) -> tuple[Any, int]:
        for value in (reply, acked):
            if isinstance(value, Exception):
                raise value
        return reply, int(acked)

    def call_replicated(self, keys: Sequence[KeyArg], args: Sequence[Arg], replicas: int,
                        timeout_ms: int) -> tuple[Any, int]:
        """Call the script, then ``WAIT replicas timeout_ms`` on the same connection (WAIT
        counts the writes of its own connection), pipelined: one round trip. Returns the
        script's reply and how many replicas acknowledged its writes. A script the server
        lacks is loaded and the pair sent again, once.

        On a cluster the pair goes to the primary the client's slot table names for the keys.
        That table goes stale when a primary fails over, and nothing else would refresh it
        for a lock that is all the traffic: a MOVED reply updates the table and the pair is
        sent once more, to the new owner; a connection error refreshes the table before it
        is raised, so the next call finds the replica that took over."""
        try:
            client = get_client()
            cluster = client if isinstance(client, RedisCluster) else None
            reply = self._send_replicated(self._owner(client, keys), keys, args, replicas,
                                          timeout_ms, cluster)
            if isinstance(reply, MovedError) and cluster is not None:
                cluster.nodes_manager.initialize(
                    additional_startup_nodes_info=[(reply.host, reply.port)])
                reply = self._send_replicated(self._owner(cluster, keys), keys, args, replicas,
                                              timeout_ms, cluster)
            if isinstance(reply, MovedError):
                raise reply
            return reply
        except CLIENT_ERRORS:
            metrics.redis_error(self.name)
            raise

    @staticmethod
    def _owner(client: SyncClient, keys: Sequence[KeyArg]) -> redis.Redis:
        """The server that holds ``keys``: ``client`` itself, or on a cluster the primary its
        slot table names."""
        if isinstance(client, RedisCluster):
            return client.get_redis_connection(client.get_node_from_key(keys[0]))
        return client

    def _send_replicated(self, client: redis.Redis, keys: Sequence[KeyArg], args: Sequence[Arg],
                         replicas: int, timeout_ms: int,
                         cluster: RedisCluster | None) -> tuple[Any, int] | MovedError:
        """:meth:`call_replicated` on one server: ``(reply, acked)``, or the MovedError a
        cluster node answered instead. A connection error refreshes ``cluster``'s slot table
        before it is raised."""
        pipe = client.pipeline(transaction=False)
        self._queue(pipe, keys, args, replicas, timeout_ms)
        try:
            reply, acked = pipe.execute(raise_on_error=False)
        except CLIENT_ERRORS:
            if cluster is not None:
                with contextlib.suppress(*CLIENT_ERRORS):
                    cluster.nodes_manager.initialize()
            raise
        if isinstance(reply, MovedError):
            return reply
        if self._missing(reply):
            if settings.USE_FUNCTIONS:
                client.function_load(registry.library()[1], replace=True)
            else:
                client.script_load(self.source)
            self._queue(pipe, keys, args, replicas, timeout_ms)
            reply, acked = pipe.execute(raise_on_error=False)
        return self._replicated(reply, acked)

    async def acall_replicated(self, keys: Sequence[KeyArg], args: Sequence[Arg], replicas: int,
                               timeout_ms: int) -> tuple[Any, int]:
        """The asyncio twin of :meth:`call_replicated` (not on a cluster: redis-py's asyncio
        cluster client has no per-node pipeline)."""
        try:
            client = get_async_client()
            if isinstance(client, redis.asyncio.cluster.RedisCluster):
                raise redis.exceptions.RedisClusterException(
                    "waiting for replicas is not available with the asyncio cluster client")
            pipe = client.pipeline(transaction=False)
            self._queue(pipe, keys, args, replicas, timeout_ms)
            reply, acked = await pipe.execute(raise_on_error=False)
            if self._missing(reply):
                if settings.USE_FUNCTIONS:
                    await client.function_load(registry.library()[1], replace=True)
                else:
                    await client.script_load(self.source)
                self._queue(pipe, keys, args, replicas, timeout_ms)
                reply, acked = await pipe.execute(raise_on_error=False)
            return self._replicated(reply, acked)
        except CLIENT_ERRORS:
            metrics.redis_error(self.name)
            raise


class Registry:
    """All scripts of all installed apps, discovered once (after apps are ready)."""

    def __init__(self) -> None:
        self._scripts: dict[str, Script] | None = None
        self._library: tuple[str, str] | None = None
        self._lock = threading.Lock()

    def _discover(self) -> dict[str, Script]:
        found: dict[str, Script] = {}
        for config in apps.get_app_configs():
            root = Path(config.path) / "redislua"
            if not root.is_dir():
                continue
            for path in sorted(root.glob("*.lua")):
                name = f"{config.label}.{path.stem}"
                source = _expand(path, root)
                if not _has_header(source):
                    raise ScriptError(f"{path} must start with a comment giving its KEYS and ARGV")
                found[name] = Script(name, source, path)
        return found

    def all(self) -> dict[str, Script]:
        scripts = self._scripts
        if scripts is None:
            with self._lock:
                if self._scripts is None:
                    self._scripts = self._discover()
                scripts = self._scripts
        return scripts

    def get(self, name: str) -> Script:
        try:
            return self.all()[name]
        except KeyError:
            known = ", ".join(sorted(self.all())) or "none"
            raise ScriptError(f"no script named {name!r} (known: {known})") from None

    def clear(self) -> None:
        self._scripts = None
        self._library = None

    def library(self) -> tuple[str, str]:
        """``(library name, source)`` of the versioned Redis Functions library of every script.

        The version is a digest of every script, so a rolling deploy can run old and new
        libraries side by side; function names carry it too, as Redis wants them unique.
        """
        if self._library is not None:
            return self._library
        scripts = self.all()
        digest = hashlib.sha1("".join(s.sha for s in scripts.values()).encode()).hexdigest()[:12]
        lib_name = f"{LIBRARY_PREFIX}{digest}"
        body = [f"#!lua name={lib_name}"]
        for script in scripts.values():
            # What comes before a script's PER_CALL line (its functions) runs once, when the
            # library loads; only what follows runs per call. Each script in its own block.
            prelude, marker, per_call = script.source.partition(PER_CALL)
            if not marker:
                prelude, per_call = "", script.source
            body.append(
                f"do\n{prelude}\nredis.register_function('{function_name(script, lib_name)}', "
                f"function(KEYS, ARGV)\n{per_call}\nend)\nend"
            )
        self._library = (lib_name, "\n".join(body))
        return self._library


registry = Registry()


def function_name(script: Script, lib_name: str) -> str:
    return f"{lib_name}__{script.function_name[len(LIBRARY_PREFIX) :]}"


def get_script(name: str) -> Script:
    """The registered script ``"app_label.name"``."""
    return registry.get(name)


def _is_missing_function(exc: ResponseError) -> bool:
    return "function not found" in str(exc).lower()
