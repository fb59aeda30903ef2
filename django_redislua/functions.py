"""Loading and checking scripts on every primary: the script cache or a Redis 7 Functions library.

Shared by ``manage.py redislua_preload`` and ``redislua_status``; knows nothing of commands.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from django_redislua.connection import primary_nodes
from django_redislua.scripts import LIBRARY_PREFIX, registry

MIN_FUNCTIONS_VERSION = (7, 0)


class FunctionsUnsupported(RuntimeError):
    pass


@dataclass(frozen=True)
class ScriptStatus:
    node: str
    name: str
    sha: str
    status: str  # "loaded", "already loaded", "missing", "present", "removed", "stale"


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
        names.add(name.decode() if isinstance(name, bytes) else str(name))
    return names


def load_scripts(check_only: bool = False) -> list[ScriptStatus]:
    """SCRIPT LOAD every registered script on every primary (or only report, with check_only)."""
    scripts = list(registry.all().values())
    report = []
    for node, client in primary_nodes():
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
        for old in sorted(library_names(client, f"{LIBRARY_PREFIX}*") - {lib_name}):
            if not check_only:
                client.function_delete(old)
            report.append(ScriptStatus(node, f"library {old}", old,
                                       "stale" if check_only else "removed"))
    return report
