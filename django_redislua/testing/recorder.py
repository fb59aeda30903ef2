"""What a server receives while a block runs, recorded with ``MONITOR``: how the suite
proves one round trip per decision."""

from __future__ import annotations

import threading
import time
from typing import Any

import redis
from redis.cluster import RedisCluster


class CommandRecorder:
    """Records the commands a server receives, with ``MONITOR``, while the block runs.

    ``commands`` holds what clients sent (e.g. ``["EVALSHA"]``); ``script_commands`` what scripts
    issued (MONITOR marks those ``lua``). Use it to prove round-trip counts in tests::

        with CommandRecorder(client) as rec:
            policy.hit("k")
        assert rec.commands == ["EVALSHA"]
    """

    _STOP = "redislua-recorder-stop"

    def __init__(self, client: redis.Redis | RedisCluster) -> None:
        # On a cluster, one recorder per primary: entries are every primary's, in time order.
        self._nodes: list[CommandRecorder] = []
        if isinstance(client, RedisCluster):
            from django_redislua.connection import primary_nodes  # needs Django's settings

            self._nodes = [CommandRecorder(node) for _name, node in primary_nodes(client)]
            self.entries: list[dict[str, object]] = []
            return
        # The recorder opens its own two connections, reaching the server the way ``client``
        # does: same address (TCP or unix socket), database and credentials, and over TLS
        # with the same certificates and checks when ``client`` uses TLS.
        pool = client.connection_pool
        given = pool.connection_kwargs
        kwargs: dict[str, Any] = {
            k: given[k]
            for k in ("host", "port", "path", "db", "username", "password", "credential_provider")
            if given.get(k) is not None
        }
        if "path" in kwargs:
            kwargs["unix_socket_path"] = kwargs.pop("path")
            kwargs.pop("host", None)
            kwargs.pop("port", None)
        if issubclass(pool.connection_class, redis.SSLConnection):
            kwargs["ssl"] = True
            kwargs.update((k, v) for k, v in given.items() if k.startswith("ssl_"))
        self._client = redis.Redis(**kwargs)
        self._control = redis.Redis(**kwargs)
        self.entries = []
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def _run(self) -> None:
        with self._client.monitor() as monitor:
            self._ready.set()
            while True:
                entry = monitor.next_command()
                if entry.get("command") == f"ECHO {self._STOP}":
                    return
                self.entries.append(entry)

    def __enter__(self) -> CommandRecorder:
        if self._nodes:
            for node in self._nodes:
                node.__enter__()
            return self
        self._control.ping()  # connect now, so its handshake is not recorded
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(5)
        time.sleep(0.05)  # MONITOR is registered once the server has answered OK
        return self

    def __exit__(self, *exc: object) -> None:
        if self._nodes:
            for node in self._nodes:
                node.__exit__(*exc)
            self.entries = sorted((e for node in self._nodes for e in node.entries),
                                  key=lambda e: float(str(e.get("time", 0))))
            return
        self._control.echo(self._STOP)
        if self._thread is not None:
            self._thread.join(5)
        self._client.close()
        self._control.close()

    @property
    def commands(self) -> list[str]:
        """Command names sent by clients (not by scripts), upper-cased."""
        return [
            str(e["command"]).split(" ", 1)[0].upper()
            for e in self.entries
            if e.get("client_type") != "lua"
        ]

    # What a client sends when it (re)connects, before any command of its caller: redis-py's
    # HELLO (RESP3), AUTH and SELECT, and CLIENT SETINFO (which Redis 7.2+ and Valkey accept and
    # record, and older servers reject before MONITOR sees it).
    HANDSHAKE = frozenset({"HELLO", "AUTH", "SELECT", "CLIENT SETINFO", "CLIENT SETNAME"})

    @property
    def commands_without_handshake(self) -> list[str]:
        """:attr:`commands` without the connection handshakes among them (:attr:`HANDSHAKE`):
        what callers sent, whichever server records which handshake commands."""
        names = []
        for entry in self.entries:
            if entry.get("client_type") == "lua":
                continue
            words = str(entry["command"]).upper().split(" ", 2)
            if words[0] not in self.HANDSHAKE and " ".join(words[:2]) not in self.HANDSHAKE:
                names.append(words[0])
        return names

    @property
    def script_commands(self) -> list[str]:
        return [
            str(e["command"]).split(" ", 1)[0].upper()
            for e in self.entries
            if e.get("client_type") == "lua"
        ]
