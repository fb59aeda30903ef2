"""A Sentinel set-up on loopback (a primary, replicas, sentinels), and its failovers."""

from __future__ import annotations

import atexit
import contextlib
import secrets
import signal
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_redislua.replies import text
from django_redislua.testing.servers import (
    RedisServer,
    _conf_quote,
    _probe_client,
    _spawn,
    _startup_output,
    _userinfo,
)


def sentinel_master_state(sentinel: redis.Redis, service_name: str) -> dict[str, str]:
    """``SENTINEL MASTER <service_name>`` as text fields (``flags`` is ``"master,s_down"``).

    Read raw, not through ``Redis.sentinel_master``: redis-py 6.x passes that parser an option
    it does not take (``TypeError: parse_sentinel_master() got an unexpected keyword argument
    'return_responses'``)."""
    reply = sentinel.execute_command("SENTINEL", "MASTER", service_name)
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=True)
    return {text(key): text(value) for key, value in pairs}


class RedisSentinelServers:
    """A primary and one Sentinel monitoring it as ``service_name``, on loopback.

    ``password`` protects the primary (the data password; the sentinel is given it with
    ``sentinel auth-pass``) and ``sentinel_password`` the sentinel itself (its
    ``requirepass``): deployments often set both, to different values.

    ``replicas``: that many replicas of the primary (``replicaof``; ``masterauth`` and
    ``requirepass`` with ``password``), in sync (each acknowledges the primary's writes) and
    known to the sentinel when start() returns, so the sentinel can fail over:
    ``kill_primary()`` SIGKILLs the current primary, ``wait_for_failover()`` waits until the
    failover is complete, ``current_primary()`` is the server the sentinel names now.
    ``primary`` stays the server started as primary.

    With replicas the sentinel is tuned to fail over fast: ``down_after_ms`` (default 2000;
    without replicas the sentinel's own default, 30 s) and ``failover_timeout_ms`` (default
    5000). Not much lower: after a failover the sentinel reconnects to the new primary at most
    once a second, so it lists it ``disconnected`` for up to a second; with a down-after of
    1000 ms it can judge the new primary down and fail over a second time, leaving two
    primaries until it reconfigures the first (seen on a loaded machine).
    """

    def __init__(
        self,
        service_name: str = "mymaster",
        *,
        password: str | None = None,
        sentinel_password: str | None = None,
        replicas: int = 0,
        down_after_ms: int | None = None,
        failover_timeout_ms: int | None = None,
    ) -> None:
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, not {replicas}")
        self.service_name = service_name
        self.password = password
        self._sentinel_password = sentinel_password
        self.replicas = replicas
        self.down_after_ms = down_after_ms if down_after_ms is not None or not replicas else 2000
        self.failover_timeout_ms = (
            failover_timeout_ms if failover_timeout_ms is not None or not replicas else 5000
        )
        # Every node may become primary: each requires the password and syncs with it, and
        # sends its replicas a snapshot at once (not after the default 5 s wait for more).
        node_args: tuple[str, ...] = ()
        if replicas:
            node_args = ("--repl-diskless-sync-delay", "0")
            if password is not None:
                node_args += ("--masterauth", password)
        self._node_args = node_args
        self.primary = RedisServer(password=password, extra_args=node_args)
        self.replica_servers: list[RedisServer] = []
        self.sentinel: RedisServer | None = None

    @property
    def url(self) -> str:
        """``redis+sentinel://[:DATA_PASSWORD@]127.0.0.1:PORT/service``.

        The userinfo is the primary's password, not the sentinel's: see sentinel_password.
        """
        assert self.sentinel is not None
        return (
            f"redis+sentinel://{_userinfo(self.password)}127.0.0.1:{self.sentinel.port}"
            f"/{self.service_name}"
        )

    @property
    def sentinel_password(self) -> str | None:
        """The sentinel's own password (its ``requirepass``), or None."""
        return self._sentinel_password

    def start(self, timeout: float = 10.0) -> RedisSentinelServers:
        deadline = time.monotonic() + timeout
        self.primary.start()
        try:
            self._start_replicas(deadline)
        except BaseException:
            self.stop()
            raise
        # Its client() logs in with the sentinel's own password.
        sentinel = RedisServer(password=self._sentinel_password)
        config = Path(sentinel.workdir, "sentinel.conf")
        lines = [
            f"port {sentinel.port}",
            "bind 127.0.0.1",
            f"sentinel monitor {self.service_name} 127.0.0.1 {self.primary.port} 1",
        ]
        if self.password is not None:
            lines.append(f"sentinel auth-pass {self.service_name} {_conf_quote(self.password)}")
        if self._sentinel_password is not None:
            lines.append(f"requirepass {_conf_quote(self._sentinel_password)}")
        if self.down_after_ms is not None:
            lines.append(
                f"sentinel down-after-milliseconds {self.service_name} {self.down_after_ms}"
            )
        if self.failover_timeout_ms is not None:
            lines.append(
                f"sentinel failover-timeout {self.service_name} {self.failover_timeout_ms}"
            )
        if self.replicas:
            lines.append(f"sentinel parallel-syncs {self.service_name} {self.replicas}")
        config.write_text("\n".join(lines) + "\n")
        # A sentinel takes its config file first and rewrites it, so it is started by hand.
        process = sentinel.process = _spawn(
            [sentinel.binary, str(config), "--sentinel", "--dir", sentinel.workdir],
            sentinel.workdir,
        )
        self.sentinel = sentinel
        atexit.register(sentinel.stop)
        probe = _probe_client(sentinel)
        try:
            while True:
                try:
                    if probe.execute_command(
                        "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name
                    ) and self._sentinel_knows_replicas(probe):
                        break
                except redis.AuthenticationError:
                    self.stop()
                    raise
                except redis.ConnectionError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    failure = _startup_output(sentinel.workdir)
                    self.stop()
                    raise RuntimeError(f"the test sentinel did not come up: {failure}")
                time.sleep(0.05)
        finally:
            probe.close()
        return self

    def _start_replicas(self, deadline: float) -> None:
        """Start the replicas and wait until each has synced (``master_link_status:up``)."""
        for _ in range(self.replicas):
            replica = RedisServer(
                password=self.password,
                extra_args=(*self._node_args, "--replicaof", "127.0.0.1", str(self.primary.port)),
            )
            self.replica_servers.append(replica)
            replica.start(timeout=max(deadline - time.monotonic(), 1.0))
        for replica in self.replica_servers:
            probe = _probe_client(replica)
            try:
                while probe.info("replication").get("master_link_status") != "up":
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"replica on port {replica.port} did not sync with the primary: "
                            f"{_startup_output(replica.workdir)}"
                        )
                    time.sleep(0.05)
            finally:
                probe.close()
        # A replica whose link is up may still not be fed: after a diskless sync the primary
        # streams to it once it acknowledges (REPLCONF ACK, up to a second later). Wait until
        # every replica acknowledges a write (set and deleted again: nothing is left).
        marker = f"redislua:testing:sync:{secrets.token_hex(8)}"
        probe = _probe_client(self.primary)
        try:
            while True:
                probe.set(marker, 1)
                probe.delete(marker)
                if int(probe.execute_command("WAIT", self.replicas, 100)) >= self.replicas:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the replicas do not acknowledge the primary's writes")
        finally:
            probe.close()

    def _sentinel_knows_replicas(self, probe: redis.Redis) -> bool:
        """Whether the sentinel lists every replica, reachable and in sync: only then can it
        promote one (it learns of them from the primary's INFO, then asks each itself)."""
        if not self.replicas:
            return True
        entries = probe.execute_command("SENTINEL", "REPLICAS", self.service_name)
        healthy = 0
        for entry in entries or ():
            # redis-py parses the reply into a dict per replica (flags become a set); a flat
            # list of names and values otherwise.
            fields = entry if isinstance(entry, dict) else dict(
                zip(entry[::2], entry[1::2], strict=True))
            state = {text(k): text(v) for k, v in fields.items()}
            if state.get("flags") == "slave" and state.get("master-link-status") == "ok":
                healthy += 1
        return healthy >= self.replicas

    def sentinel_client(self, **kwargs: object) -> redis.Redis:
        """A client of the sentinel (logged in with its own password)."""
        assert self.sentinel is not None, "start() first"
        return self.sentinel.client(**kwargs)

    def primary_address(self) -> tuple[str, int]:
        """``(host, port)`` of the primary the sentinel names now (GET-MASTER-ADDR-BY-NAME)."""
        probe = self.sentinel_client(
            socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
        )
        try:
            host, port = probe.execute_command(
                "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name
            )
        finally:
            probe.close()
        return text(host), int(port)

    def current_primary(self) -> RedisServer:
        """The server the sentinel names as primary now."""
        _host, port = self.primary_address()
        for server in (self.primary, *self.replica_servers):
            if server.port == port:
                return server
        raise RuntimeError(f"the sentinel names port {port}, none of this set-up's servers")

    def kill_primary(self) -> RedisServer:
        """SIGKILL the current primary (no shutdown, no goodbye to clients or replicas) and
        return it; stop() cleans up after it. Sentinel then fails over to a replica."""
        server = self.current_primary()
        process = server.process
        if process is None or process.poll() is not None:
            raise RuntimeError(f"the primary on port {server.port} is not running")
        process.send_signal(signal.SIGKILL)
        process.wait(5)
        return server

    def failover_done(self, old: RedisServer) -> RedisServer | None:
        """The new primary once the failover from ``old`` is complete, else None.

        Complete as clients see it: ``SENTINEL MASTER`` names another server and flags it
        neither down nor failing over (redis-py's Sentinel client checks exactly that, and
        finds no primary before: MasterNotFoundError). ``GET-MASTER-ADDR-BY-NAME`` names the
        promoted replica earlier, while the sentinel still reconfigures the other replicas.
        """
        probe = self.sentinel_client(
            socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
        )
        try:
            state = sentinel_master_state(probe, self.service_name)
        finally:
            probe.close()
        flags = set(state.get("flags", "").split(","))
        failing = {"s_down", "o_down", "failover_in_progress"}
        if int(state["port"]) == old.port or "master" not in flags or flags & failing:
            return None
        for server in (self.primary, *self.replica_servers):
            if server.port == int(state["port"]):
                break
        else:
            raise RuntimeError(f"the sentinel names port {state['port']}, not one of ours")
        server_probe = _probe_client(server)
        try:
            if server_probe.info("replication").get("role") != "master":
                return None
        finally:
            server_probe.close()
        return server

    def wait_for_failover(self, old: RedisServer, timeout: float = 30.0) -> RedisServer:
        """Wait until the failover from ``old`` is complete (see failover_done) and return the
        new primary. RuntimeError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                server = self.failover_done(old)
                if server is not None:
                    return server
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the sentinel did not fail over from port {old.port} within {timeout}s"
                )
            time.sleep(0.02)

    def stop(self) -> None:
        if self.sentinel is not None:
            self.sentinel.stop()
        for replica in self.replica_servers:
            replica.stop()
        self.primary.stop()

    def __enter__(self) -> RedisSentinelServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
