"""A real Redis Cluster on loopback, of throwaway servers."""

from __future__ import annotations

import time

import redis

from django_redislua.testing.servers import RedisServer, _userinfo, free_cluster_port


class RedisClusterServers:
    """A real Redis Cluster on loopback: ``primaries`` primaries, ``replicas`` replicas each.

    With ``password`` every node requires it (``requirepass``) and replicas use it to sync from
    their primary (``masterauth``), as in a protected production cluster.
    """

    def __init__(
        self, primaries: int = 3, replicas: int = 1, *, password: str | None = None,
        first_port: int | None = None,
    ) -> None:
        self.primaries = primaries
        self.replicas = replicas
        self.password = password
        # A port chosen beforehand (free_cluster_port()), so settings can name the cluster
        # before it exists: tests of an app started while its cluster is down.
        self.first_port = first_port
        self.servers: list[RedisServer] = []

    @property
    def url(self) -> str:
        return f"redis+cluster://{_userinfo(self.password)}127.0.0.1:{self.servers[0].port}"

    def start(self, timeout: float = 30.0) -> RedisClusterServers:
        total = self.primaries * (1 + self.replicas)
        masterauth = ("--masterauth", self.password) if self.password is not None else ()
        for index in range(total):
            server = RedisServer(
                # None: a port (and bus port) of its own choosing, chosen again when taken
                port=self.first_port if index == 0 and self.first_port else None,
                choose_port=free_cluster_port,
                extra_args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    f"nodes-{index}.conf",
                    "--cluster-node-timeout",
                    "2000",
                    # Replicas sync at once, not after the default 5 s wait for more of them.
                    "--repl-diskless-sync-delay",
                    "0",
                    *masterauth,
                ),
                password=self.password,
            )
            self.servers.append(server.start())
        clients = [s.client(decode_responses=True) for s in self.servers]
        ids = [c.execute_command("CLUSTER MYID") for c in clients]
        for client in clients[1:]:
            client.execute_command("CLUSTER MEET", "127.0.0.1", self.servers[0].port)
        per_primary = 16384 // self.primaries
        for index in range(self.primaries):
            first = index * per_primary
            last = 16383 if index == self.primaries - 1 else first + per_primary - 1
            clients[index].execute_command("CLUSTER ADDSLOTS", *range(first, last + 1))
        deadline = time.monotonic() + timeout
        for offset, client in enumerate(clients[self.primaries :]):
            primary_id = ids[offset % self.primaries]
            while True:  # a replica can only follow a primary it has heard of
                try:
                    client.execute_command("CLUSTER REPLICATE", primary_id)
                    break
                except redis.ResponseError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        while not all(c.cluster("INFO")["cluster_state"] == "ok" for c in clients):
            if time.monotonic() > deadline:
                raise RuntimeError("the test cluster did not reach cluster_state:ok")
            time.sleep(0.1)
        for client in clients:
            client.close()
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers.clear()

    def __enter__(self) -> RedisClusterServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
