"""Loading and checking scripts on every primary: the script cache or a Redis 7 Functions library.

Shared by ``manage.py redislua_preload`` and ``redislua_status``; knows nothing of commands.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from django_redislua.connection import primary_nodes
from django_redislua.replies import text
from django_redislua.scripts import LIBRARY_PREFIX, Script, registry

MIN_FUNCTIONS_VERSION = (7, 0)


class FunctionsUnsupported(RuntimeError):
    pass


@dataclass(frozen=True)
class ScriptStatus:
    node: str
    name: str
    sha: str
    status: str  # "loaded", "already loaded", "missing", "present", "removed", "stale",
    # "unreachable" (a replica this process cannot connect to)


REPLICA_WAIT_MS = 1000  # how long a Functions load waits for its replicas to have it


def replicas_of(node: str, client: redis.Redis) -> list[tuple[str, redis.Redis | None]]:
    """``(name, client)`` of every replica the primary ``client`` reports (``INFO
    replication``), reached with the primary's own connection options (credentials, TLS); the
    client is None when the replica cannot be reached from here (an address only the primary
    sees). The name says whose replica it is."""
    found: list[tuple[str, redis.Redis | None]] = []
    pool = client.connection_pool
    for key, value in client.info("replication").items():
        if not (key.startswith("slave") and isinstance(value, dict)):
            continue
        host, port = str(value["ip"]), int(value["port"])
        name = f"{host}:{port} (replica of {node})"
        kwargs = {k: v for k, v in pool.connection_kwargs.items() if k != "path"}
        replica = redis.Redis(connection_pool=redis.ConnectionPool(
            connection_class=(redis.SSLConnection
                              if issubclass(pool.connection_class, redis.SSLConnection)
                              else redis.Connection),
            **{**kwargs, "host": host, "port": port}))
        try:
            replica.ping()
        except redis.RedisError:
            replica.close()
            found.append((name, None))
            continue
        found.append((name, replica))
    return found


def server_version(client: redis.Redis) -> tuple[int, ...]:
    info = client.info("server")
    return tuple(int(p) for p in str(info["redis_version"]).split(".")[:3])


def library_names(client: redis.Redis, pattern: str = "*") -> set[str]:
    """Names of the Function libraries on ``client`` matching ``pattern``."""
    names = set()
    for entry in client.function_list(library=pattern):
        if not isinstance(entry, dict):  # RESP2 answers a flat list of names and values
            entry = dict(zip(entry[::2], entry[1::2], strict=True))
        fields = entry
        name = fields.get("library_name", fields.get(b"library_name"))
        names.add(text(name))
    return names


def load_scripts(check_only: bool = False) -> list[ScriptStatus]:
    """SCRIPT LOAD every registered script on every primary (or only report, with check_only),
    and on each primary's replicas: the script cache is not replicated, and a replica that
    becomes primary would otherwise answer its first calls NOSCRIPT."""
    scripts = list(registry.all().values())
    report = []
    for node, client in primary_nodes():
        report += _load_scripts(node, client, scripts, check_only)
        for name, replica in replicas_of(node, client):
            if replica is None:
                report.append(ScriptStatus(name, "(every script)", "-", "unreachable"))
                continue
            try:
                report += _load_scripts(name, replica, scripts, check_only)
            finally:
                replica.close()
    return report


def _load_scripts(node: str, client: redis.Redis, scripts: list[Script],
                  check_only: bool) -> list[ScriptStatus]:
    report = []
    present = client.script_exists(*[s.sha for s in scripts]) if scripts else []
    for script, exists in zip(scripts, present, strict=True):
        if exists:
            status = "present" if check_only else "already loaded"
        elif check_only:
            status = "missing"
        else:
            client.script_load(script.source)
            status = "loaded"
        report.append(ScriptStatus(node, script.name, script.sha, status))
    return report


def load_functions(check_only: bool = False) -> list[ScriptStatus]:
    """FUNCTION LOAD the versioned library of every script on every primary (Redis >= 7), and
    FUNCTION DELETE this app's libraries of earlier releases ("stale" with ``check_only``).

    Removing them is safe during a rolling deploy: a server still running an earlier release
    that calls a function of its removed library gets "function not found" and loads its own
    library again (``Script.__call__``), once.
    """
    lib_name, source = registry.library()
    report = []
    for node, client in primary_nodes():
        version = server_version(client)
        if version < MIN_FUNCTIONS_VERSION:
            raise FunctionsUnsupported(
                f"{node} runs Redis {'.'.join(map(str, version))}; Functions need Redis 7.0 or "
                "newer. Use `redislua_preload` without --functions (the script cache)."
            )
        exists = lib_name in library_names(client, lib_name)
        if exists:
            status = "present" if check_only else "already loaded"
        elif check_only:
            status = "missing"
        else:
            client.function_load(source, replace=True)
            status = "loaded"
        report.append(ScriptStatus(node, f"library {lib_name}", lib_name, status))
        replicas = replicas_of(node, client)
        if status == "loaded" and replicas:  # Functions replicate: let them arrive
            client.wait(len(replicas), REPLICA_WAIT_MS)
        for name, replica in replicas:
            if replica is None:
                report.append(ScriptStatus(name, f"library {lib_name}", lib_name, "unreachable"))
                continue
            try:
                there = lib_name in library_names(replica, lib_name)
            finally:
                replica.close()
            report.append(ScriptStatus(name, f"library {lib_name}", lib_name,
                                       "present" if there else "missing"))
        for old in sorted(library_names(client, f"{LIBRARY_PREFIX}*") - {lib_name}):
            if not check_only:
                client.function_delete(old)
            report.append(ScriptStatus(node, f"library {old}", old,
                                       "stale" if check_only else "removed"))
    return report
