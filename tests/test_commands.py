from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_redislua import get_policy
from django_redislua.scripts import registry

BASE = {"POLICIES": {"login": {"rate": "5/m", "key": "ip"}}}


def run(*args):
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_preload_then_check_passes(r):
    out = run("redislua_preload")
    for name, script in registry.all().items():
        assert name in out and script.sha in out
    assert "loaded" in out
    assert "present" in run("redislua_preload", "--check")
    assert "already loaded" in run("redislua_preload")


def test_check_after_script_flush_fails_and_names_missing(r):
    run("redislua_preload")
    r.script_flush()
    with pytest.raises(CommandError, match=r"missing: .*django_redislua\.ratelimit") as info:
        run("redislua_preload", "--check")
    assert info.value.returncode == 1


def test_functions_load_and_check(r):
    with pytest.raises(CommandError, match="missing"):
        run("redislua_preload", "--functions", "--check")
    out = run("redislua_preload", "--functions")
    lib_name, _ = registry.library()
    assert lib_name in out and "loaded" in out
    assert "present" in run("redislua_preload", "--functions", "--check")


def test_functions_preload_removes_libraries_of_earlier_releases(r):
    from django_redislua.functions import library_names

    old = "redislua_0123456789ab"
    r.function_load(f"#!lua name={old}\nredis.register_function('{old}__x', "
                    "function() return 1 end)")
    r.function_load("#!lua name=someone_else\nredis.register_function('theirs', "
                    "function() return 2 end)")
    with pytest.raises(CommandError):  # this release's library is still missing: exit 1
        run("redislua_preload", "--functions", "--check")
    out = run("redislua_preload", "--functions")
    assert f"{old}" in out and "removed" in out
    lib_name, _ = registry.library()
    assert library_names(r) == {lib_name, "someone_else"}  # others' libraries are left alone
    r.function_load(f"#!lua name={old}\nredis.register_function('{old}__x', "
                    "function() return 1 end)")
    out = run("redislua_preload", "--functions", "--check")  # present: exit 0
    assert f"library {old}" in out and "stale" in out and old in library_names(r)


@pytest.mark.django_db
def test_a_server_of_an_earlier_release_reloads_its_library_once(r, settings):
    """Removing a library under a running server of that release is safe: its next call
    finds the function missing, loads its library again, and answers."""
    settings.REDISLUA = {**settings.REDISLUA, "USE_FUNCTIONS": True}
    assert get_policy("login").hit("k").allowed  # loads this release's library
    r.function_flush()
    assert get_policy("login").hit("k").allowed


def test_functions_on_a_real_redis_6_say_so_and_scripts_still_load(redis6):
    with override_settings(REDISLUA={"CONNECTION": redis6.url}):
        with pytest.raises(CommandError, match=r"Redis 6\.2\.\d+; Functions need Redis 7\.0"):
            run("redislua_preload", "--functions")
        assert "loaded" in run("redislua_preload")
        assert "present" in run("redislua_preload", "--check")


def test_preload_check_exit_code_from_the_shell(r, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "django", "redislua_preload"]
    assert subprocess.run(cmd, env=env, cwd=root, capture_output=True).returncode == 0
    assert subprocess.run([*cmd, "--check"], env=env, cwd=root, capture_output=True).returncode == 0
    r.script_flush()
    result = subprocess.run([*cmd, "--check"], env=env, cwd=root, capture_output=True, text=True)
    assert result.returncode == 1
    assert "django_redislua.ratelimit" in result.stderr


def test_status_shows_server_policies_scripts_and_keys(r):
    get_policy("api").hit("u1")
    out = run("redislua_status")
    assert "Redis " in out and "api: gcra 100/m" in out
    assert "export: concurrency 2 slots" in out
    assert "django_redislua.ratelimit" in out and "present" in out
    assert "1 keys under rl:*" in out


@pytest.mark.parametrize(
    "command",
    [("redislua_status",), ("redislua_locks",), ("redislua_locks", "--release", "x"),
     ("redislua_preload",), ("redislua_preload", "--check"), ("redislua_reset", "login", "k")],
)
@pytest.mark.parametrize(
    "connection",
    ["redis://127.0.0.1:1/0", "redis+cluster://127.0.0.1:1", "redis://127.0.0.1:notaport/0"],
)
def test_every_command_with_redis_down_is_a_clean_error(command, connection):
    with (
        override_settings(REDISLUA={**BASE, "CONNECTION": connection}),
        pytest.raises(CommandError, match="Redis unreachable"),
    ):
        run(*command)


def test_reset_forgets_one_identity(r):
    policy = get_policy("login")
    for _ in range(5):
        policy.hit("1.2.3.4")
    assert not policy.hit("1.2.3.4").allowed
    out = run("redislua_reset", "login", "1.2.3.4")
    assert policy.redis_key("1.2.3.4") in out
    assert policy.hit("1.2.3.4").allowed


def test_reset_unknown_policy():
    with pytest.raises(CommandError, match="no policy named 'nope' is in use"):
        run("redislua_reset", "nope", "x")


def test_reset_says_when_there_was_nothing_to_reset(r):
    assert "nothing to reset" in run("redislua_reset", "login", "never-seen")


@pytest.mark.django_db
def test_reset_knows_inline_and_drf_policies(r, client):
    from django_redislua import drf
    from django_redislua.discovery import policies_in_use

    for _ in range(3):
        client.get("/rl/inline/")
    assert client.get("/rl/inline/").status_code == 429
    inline = next(n for n, e in policies_in_use().items() if e.source == "view rl/inline/")
    assert "reset " in run("redislua_reset", inline, "127.0.0.1")
    assert client.get("/rl/inline/").status_code == 200
    drf.scope_policy("user", "1000/m").hit("throttle_user_7")
    assert "reset " in run("redislua_reset", "user", "throttle_user_7")


@pytest.mark.cluster
def test_preload_loads_every_primary_of_a_cluster(redis_cluster):
    with override_settings(REDISLUA={"CONNECTION": redis_cluster.url}):
        out = run("redislua_preload")
        primaries = {line.split()[0] for line in out.splitlines() if "(replica of" not in line}
        replicas = {line.split()[0] for line in out.splitlines() if "(replica of" in line}
        assert len(primaries) == 3 and len(replicas) == 3  # the script cache is not replicated
        assert "present" in run("redislua_preload", "--check")
        for server in redis_cluster.servers[:3]:
            server.client().script_flush()
        with pytest.raises(CommandError, match="missing"):
            run("redislua_preload", "--check")


def test_preload_reaches_a_password_protected_replica_and_reports_an_unreachable_one():
    """Replicas are reached with the primary's credentials; a replica announcing an address
    this machine cannot reach is reported "unreachable", and the load still succeeds."""
    import time

    from django_redislua.testing import RedisServer

    password = "repl s3cret"
    with RedisServer(password=password) as primary, \
            RedisServer(password=password, extra_args=(
                "--replicaof", "127.0.0.1", str(primary.port), "--masterauth", password)), \
            RedisServer(password=password, extra_args=(
                "--replicaof", "127.0.0.1", str(primary.port), "--masterauth", password,
                "--replica-announce-ip", "192.0.2.1")):  # TEST-NET-1: nothing answers
        with primary.client() as client:
            deadline = time.monotonic() + 10
            while client.info("replication")["connected_slaves"] < 2:
                assert time.monotonic() < deadline, "the replicas did not connect"
                time.sleep(0.05)
        url = f"redis://:{password.replace(' ', '%20')}@127.0.0.1:{primary.port}/0"
        with override_settings(REDISLUA={"CONNECTION": url, "SOCKET_CONNECT_TIMEOUT": 0.5}):
            out = run("redislua_preload").splitlines()
            reachable = [line for line in out if "(replica of" in line and "127.0.0.1:" in
                         line.split()[0] and line.endswith("loaded")]
            unreachable = [line for line in out if line.startswith("192.0.2.1:")]
            assert len(reachable) == len(registry.all())
            assert len(unreachable) == 1 and unreachable[0].endswith("unreachable")
