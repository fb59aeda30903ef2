from pathlib import Path

import pytest
from django.test import override_settings

from django_redislua.functions import library_names
from django_redislua.scripts import Registry, Script, ScriptError, _expand, get_script, registry


def test_package_and_app_scripts_are_discovered():
    names = set(registry.all())
    assert "django_redislua.ratelimit" in names
    assert "testapp.echo" in names


def test_includes_are_expanded_into_one_script():
    source = get_script("django_redislua.ratelimit").source
    assert "--#include" not in source
    assert "code == 'gc'" in source and "code == 'fw'" in source
    assert 'gcra ("gc"): the generic cell rate algorithm' in source  # lib/gcra.lua's block


@pytest.mark.parametrize("code", ["fw", "sw", "sl", "tb", "lb", "gc", "cc"])
def test_single_policy_scripts_define_no_function(code):
    """An EVALSHA re-creates every function its script defines, on every call: the scripts a
    single check runs are flat (lib/*.lua blocks), so none is defined per decision."""
    source = get_script(f"django_redislua.ratelimit_{code}").source
    code_lines = [line.split("--")[0] for line in source.splitlines()]
    assert not [line for line in code_lines if "function" in line]
    assert "--#include" not in source


def test_app_script_runs(r):
    assert get_script("testapp.echo")(keys=["k"], args=["v"]) == b"v"
    assert r.get("k") == b"v"


def test_unknown_script_names_the_known_ones():
    with pytest.raises(ScriptError, match=r"testapp\.echo"):
        get_script("nope.nothing")


def test_call_after_script_flush_reloads_once(r, recorder):
    script = get_script("testapp.echo")
    script(keys=["k"], args=["1"])
    r.script_flush()
    with recorder:
        assert script(keys=["k"], args=["2"]) == b"2"
    # NOSCRIPT, then SCRIPT LOAD, then the retried EVALSHA; nothing else.
    assert recorder.commands == ["EVALSHA", "SCRIPT", "EVALSHA"]


def test_one_call_is_one_evalsha(recorder):
    script = get_script("testapp.echo")
    script(keys=["k"], args=["1"])
    with recorder:
        script(keys=["k"], args=["2"])
    assert recorder.commands == ["EVALSHA"]
    assert recorder.script_commands == ["SET", "GET"]


async def test_async_call_after_flush(r):
    r.script_flush()
    assert await get_script("testapp.echo").acall(keys=["ak"], args=["x"]) == b"x"


def test_file_without_header_is_refused(tmp_path: Path, monkeypatch):
    root = tmp_path / "redislua"
    root.mkdir()
    (root / "bad.lua").write_text("return 1\n")

    class Config:
        label = "bad"
        path = str(tmp_path)

    monkeypatch.setattr("django_redislua.scripts.apps.get_app_configs", lambda: [Config])
    with pytest.raises(ScriptError, match="KEYS and ARGV"):
        Registry().all()


def test_include_cannot_leave_the_scripts_folder(tmp_path: Path):
    (tmp_path / "a.lua").write_text("-- KEYS: none; ARGV: none\n--#include ../../etc/passwd\n")
    with pytest.raises(ScriptError, match="leaves"):
        _expand(tmp_path / "a.lua", tmp_path)


def test_include_cycle_is_reported(tmp_path: Path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "x.lua").write_text("--#include lib/x.lua\n")
    with pytest.raises(ScriptError, match="cycle"):
        _expand(tmp_path / "lib" / "x.lua", tmp_path)


def test_every_shipped_lua_file_heads_itself_with_keys_and_argv():
    root = Path(__file__).resolve().parent.parent / "django_redislua" / "redislua"
    files = sorted(root.rglob("*.lua"))
    assert files
    for path in files:
        head = []
        for line in path.read_text().splitlines():
            if not line.startswith("--"):
                break
            head.append(line)
        text = "\n".join(head)
        if path.parent.name == "lib":
            assert head, f"{path} has no header comment"
        else:
            assert "KEYS" in text and "ARGV" in text, f"{path} does not document KEYS and ARGV"


def test_functions_mode_calls_fcall_and_loads_library_on_demand(r, recorder):
    script = get_script("testapp.echo")
    with override_settings(REDISLUA={"CONNECTION": "default", "USE_FUNCTIONS": True}):
        assert script(keys=["fk"], args=["1"]) == b"1"  # loads the library
        with recorder:
            assert script(keys=["fk"], args=["2"]) == b"2"
    assert recorder.commands == ["FCALL"]
    lib_name, _ = registry.library()
    assert library_names(r) == {lib_name}


def test_script_repr_and_sha():
    script = Script("x.y", "-- KEYS none ARGV none\nreturn 1")
    assert len(script.sha) == 40 and "x.y" in repr(script)
