"""A client for model tests that inject time: see :class:`TransactionalClient`."""

from __future__ import annotations

from typing import Any

import redis
from redis.cluster import RedisCluster

from django_redislua.connection import primary_nodes


class TransactionalClient:
    """Stands in for the app's client in script calls (``client=`` or ``scripts.get_client``):
    each EVALSHA (or FCALL) runs in MULTI/EXEC, on the primary that holds its keys (a
    cluster's too), with PTTL and PERSIST of every key, so the expiry it set is observed
    (``pttls``) and real time cannot expire the state of a test that injects time."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.pttls: dict[str, int] = {}
        # The expiry in force per key, in the injected time of a test that tracks it (the PTTL
        # it last observed set, carried to that test's clock: see tests/test_engine_properties).
        self.expires_at: dict[str, int] = {}

    def execute_command(self, command: str, *args: Any) -> Any:
        if command in ("SCRIPT LOAD", "FUNCTION LOAD"):
            for _name, node in primary_nodes(self.client):
                node.execute_command(command, *args)
            return None
        assert command in ("EVALSHA", "FCALL"), command
        sha, numkeys, *keys_and_args = args
        keys = [str(k) for k in keys_and_args[:numkeys]]
        node = self.client
        if isinstance(node, RedisCluster):
            node = node.get_node_from_key(keys[0]).redis_connection
        assert isinstance(node, redis.Redis)
        pipe = node.pipeline(transaction=True)
        pipe.execute_command(command, sha, numkeys, *keys_and_args)
        for key in keys:
            pipe.pttl(key)
            pipe.persist(key)
        replies = pipe.execute(raise_on_error=False)
        if isinstance(replies[0], Exception):
            raise replies[0]
        self.pttls = {key: replies[1 + 2 * i] for i, key in enumerate(keys)}
        return replies[0]
