"""The settings schema (``django_redislua.conf.Settings``): one entry per ``REDISLUA`` key, read
by the facade and by the checks alike (issue 36), and by docs/settings.md's table.

Each rule's message is pinned here word for word: the checks said exactly this before the
schema, and say it still. What a bad value reads as at request time is pinned too.
"""

from __future__ import annotations

import ast
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from django_redislua import conf
from django_redislua.checks import FIXES, check_settings
from django_redislua.conf import DEFAULTS, SCHEMA, Setting, Settings, settings
from django_redislua.decorators import Spec
from django_redislua.limiting import Policy, definition, registry

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_docs_table_lists_every_setting_with_its_default_in_order() -> None:
    rows = re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", (DOCS / "settings.md").read_text(),
                      re.MULTILINE)
    assert [name for name, _ in rows] == [entry.name for entry in SCHEMA]
    for name, default in rows:
        assert ast.literal_eval(default) == DEFAULTS[name], name


def test_the_schema_is_the_facade_and_the_defaults() -> None:
    assert list(DEFAULTS) == [entry.name for entry in SCHEMA]
    assert all(isinstance(getattr(Settings, entry.name), Setting) for entry in SCHEMA)
    assert [name for name in vars(Settings) if name.isupper()] == list(DEFAULTS)
    for entry in SCHEMA:
        assert entry.problems(entry.default) == [], entry.name
        assert entry.value_of(entry.default) == entry.default, entry.name
        assert entry.check_id is None or entry.check_id in FIXES, entry.name
        assert (entry.rule is None) == (entry.check_id is None), entry.name


def test_with_no_redislua_every_setting_reads_its_default() -> None:
    with override_settings(REDISLUA={}):
        for entry in SCHEMA:
            assert getattr(settings, entry.name) == entry.default, entry.name


LONG = "x" * 100
# (setting, bad value, the message of its check) for every setting the schema checks.
MESSAGES: list[tuple[str, Any, str]] = [
    ("CONNECTION_OPTIONS", [], "REDISLUA['CONNECTION_OPTIONS'] must be a dict."),
    ("SOCKET_TIMEOUT", 0,
     "REDISLUA['SOCKET_TIMEOUT'] must be a number of seconds > 0 or None, not 0."),
    ("SOCKET_CONNECT_TIMEOUT", "1s",
     "REDISLUA['SOCKET_CONNECT_TIMEOUT'] must be a number of seconds > 0 or None, not '1s'."),
    ("KEY_PREFIX", "a{b}",
     "REDISLUA['KEY_PREFIX'] must be a non-empty string without braces or spaces, not 'a{b}'."),
    ("FAIL_OPEN", "yes", "REDISLUA['FAIL_OPEN'] must be True or False."),
    ("HEADERS", "rfc",
     "REDISLUA['HEADERS'] must be one of ('ietf', 'legacy', 'both', None), not 'rfc'."),
    ("TRUSTED_PROXIES", -1, "REDISLUA['TRUSTED_PROXIES'] must be a whole number >= 0, not -1."),
    ("IPV4_MASK", 33, "REDISLUA['IPV4_MASK'] must be between 1 and 32, not 33."),
    ("IPV6_MASK", True, "REDISLUA['IPV6_MASK'] must be between 1 and 128, not True."),
    ("DENIED_VIEW", "django.conf.settings",
     "REDISLUA['DENIED_VIEW'] 'django.conf.settings' is not callable."),
    ("DENIED_BODY", LONG,
     f"REDISLUA['DENIED_BODY'] must be one of ('text', 'problem'), not {LONG!r:.80}; denials "
     "keep the plain text body until it is fixed."),
    ("USE_FUNCTIONS", "false", "REDISLUA['USE_FUNCTIONS'] must be True or False, not 'false'."),
    ("LOCAL_DENY", 1, "REDISLUA['LOCAL_DENY'] must be True or False, not 1."),
    ("LEAN_CALLS", None, "REDISLUA['LEAN_CALLS'] must be True or False, not None."),
    ("PIPELINING", "on", "REDISLUA['PIPELINING'] must be True or False, not 'on'."),
    ("ENABLED", "no", "REDISLUA['ENABLED'] must be True or False, not 'no'."),
    ("METRICS", ["prometheus", "prometheus"],
     "REDISLUA['METRICS'] must be \"auto\" or a list of ['prometheus', 'opentelemetry'] (each "
     "at most once), not ['prometheus', 'prometheus']."),
    ("METRICS_TOKEN", "short",  # never the token itself
     "REDISLUA['METRICS_TOKEN'] must be None or a string of at least 16 characters, not a str "
     "of 5."),
    ("METRICS_TOKEN", 12345678901234567,
     "REDISLUA['METRICS_TOKEN'] must be None or a string of at least 16 characters, not a int."),
    ("LOCK_CLAIM_WINDOW", 61,
     "REDISLUA['LOCK_CLAIM_WINDOW'] must be a number of seconds > 0 and <= 60, not 61."),
]


@pytest.mark.parametrize(("name", "value", "message"), MESSAGES)
def test_each_rule_reports_its_check_id_and_message(name: str, value: Any, message: str) -> None:
    from django_redislua.links import check_url

    check_id = getattr(Settings, name).check_id
    with override_settings(REDISLUA={"CONNECTION": "redis://127.0.0.1:1/0", name: value}):
        [found] = check_settings()
    assert (found.id, found.msg) == (check_id, message)
    assert found.hint == f"{FIXES[check_id]} See {check_url(check_id)}"


def test_every_checked_setting_has_a_pinned_message() -> None:
    assert {name for name, _, _ in MESSAGES} == {e.name for e in SCHEMA if e.rule is not None}


def test_denied_view_that_does_not_import_says_why() -> None:
    with override_settings(REDISLUA={"DENIED_VIEW": "django_redislua.nowhere.view"}):
        [found] = [m for m in check_settings() if m.id == "redislua.E018"]
    assert found.msg == ("REDISLUA['DENIED_VIEW'] 'django_redislua.nowhere.view' cannot be "
                         "imported: No module named 'django_redislua.nowhere'")


@pytest.mark.parametrize("value", [float("nan"), -0.5])
def test_a_timeout_that_is_no_positive_number_is_e019(value: float) -> None:
    # nan passed the old "not <= 0" test, and a socket refuses it when it connects
    with override_settings(REDISLUA={"SOCKET_TIMEOUT": value}):
        assert [m.id for m in check_settings() if m.id == "redislua.E019"] == ["redislua.E019"]


# (setting, a value its check reports, what the app runs on meanwhile): as before the schema,
# but for a value the read could not take, which raised and now reads as the default.
READS: list[tuple[str, Any, Any]] = [
    ("FAIL_OPEN", "false", True),  # bool("false"): why E013 exists
    ("FAIL_OPEN", 0, False),
    ("ENABLED", "false", True),
    ("LOCAL_DENY", 0, False),
    ("TRUSTED_PROXIES", 2.0, 2),
    ("TRUSTED_PROXIES", -1, -1),
    ("TRUSTED_PROXIES", "x", 0),  # raised ValueError
    ("IPV4_MASK", "24", 24),
    ("IPV6_MASK", None, 64),  # raised TypeError
    ("KEY_PREFIX", 7, "7"),
    ("HEADERS", "rfc", "rfc"),
    ("SOCKET_TIMEOUT", 0, 0.0),
    ("SOCKET_TIMEOUT", "soon", 0.5),  # raised ValueError, in the connection check too
    ("SOCKET_CONNECT_TIMEOUT", [], 0.5),  # raised TypeError
    ("CONNECTION_OPTIONS", [("client_name", "web")], {"client_name": "web"}),
    ("CONNECTION_OPTIONS", None, {}),  # raised TypeError, in the connection check too
    ("DENIED_BODY", "json", "text"),
    ("DENIED_BODY", ["problem"], "text"),
    ("METRICS", "prom", "prom"),  # metrics.wanted() records it as "auto"
    ("METRICS_TOKEN", "short", None),
    ("METRICS_TOKEN", 1234567890123456789, None),
    ("LOCK_CLAIM_WINDOW", "soon", 1.0),
    ("LOCK_CLAIM_WINDOW", 0, 1.0),
    ("LOCK_CLAIM_WINDOW", 5, 5.0),  # not bad: a float, as before
]


@pytest.mark.parametrize(("name", "value", "reads"), READS)
def test_what_a_value_reads_as(name: str, value: Any, reads: Any) -> None:
    with override_settings(REDISLUA={name: value}):
        got = getattr(settings, name)
        assert got == reads and type(got) is type(reads)
        assert getattr(settings, name) == reads  # the kept value, the same


def test_reads_are_live_under_override_settings() -> None:
    before = conf.generation
    ran: list[str] = []
    callback = conf.on_change(lambda: ran.append(settings.KEY_PREFIX))
    try:
        prefix = settings.KEY_PREFIX
        with override_settings(REDISLUA={"KEY_PREFIX": "other", "LOCK_CLAIM_WINDOW": 0.25}):
            assert settings.KEY_PREFIX == "other" and settings.LOCK_CLAIM_WINDOW == 0.25
            assert conf.generation == before + 1
            with override_settings(REDISLUA={"KEY_PREFIX": "inner"}):
                assert settings.KEY_PREFIX == "inner" and settings.LOCK_CLAIM_WINDOW == 1.0
            assert settings.KEY_PREFIX == "other"
        assert prefix == settings.KEY_PREFIX and conf.generation == before + 4
        with override_settings(CACHES={}):  # CACHES drops the cached values too
            assert conf.generation == before + 5
        # Each callback runs after the caches are dropped: it reads the new settings.
        assert ran == ["other", "inner", "other", prefix, prefix, prefix]
    finally:
        conf._on_change.remove(callback)


def test_a_value_made_while_the_settings_change_is_made_again() -> None:
    """The generation moves once every cache is reset: what another thread derives in between
    (here a view's rule, from a policy the registry has not forgotten yet) carries the old
    generation and is made again from the new settings."""
    spec = Spec("generation", None, {})
    made: list[Any] = []
    with override_settings(REDISLUA={"POLICIES": {"generation": {"rate": "5/m"}}}):
        assert spec.rule("view").policy.limit == 5  # type: ignore[union-attr]
        # First in line: it runs before the registry forgets the policies it built.
        conf._on_change.insert(0, lambda: made.append(spec.rule("view")))
        try:
            with override_settings(REDISLUA={"POLICIES": {"generation": {"rate": "7/m"}}}):
                assert [rule.policy.limit for rule in made] == [5]
                assert spec.rule("view").policy.limit == 7  # type: ignore[union-attr]
        finally:
            del conf._on_change[0]


def test_a_policy_built_from_settings_that_changed_meanwhile_is_not_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread that read POLICIES before a change and builds after it gets the policy it read
    (its call began before the change), but the registry does not keep it for later calls."""
    read, changed = threading.Event(), threading.Event()
    build = registry.build_policy

    def paused(name: str, options: Any) -> Any:
        read.set()  # POLICIES read: the change happens now
        assert changed.wait(5)
        return build(name, options)

    with override_settings(REDISLUA={"POLICIES": {"built": {"rate": "5/m"}}}):
        monkeypatch.setattr(registry, "build_policy", paused)
        slow: list[Any] = []
        thread = threading.Thread(target=lambda: slow.append(registry.get_policy("built")))
        thread.start()
        assert read.wait(5)
        monkeypatch.setattr(registry, "build_policy", build)
        with override_settings(REDISLUA={"POLICIES": {"built": {"rate": "7/m"}}}):
            changed.set()
            thread.join()
            assert [policy.limit for policy in slow] == [5]
            assert registry.get_policy("built").limit == 7
            assert Spec("built", None, {}).rule("view").policy.limit == 7  # type: ignore[union-attr]


def test_a_key_head_made_while_the_prefix_changes_is_made_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy's key head read the prefix, then the settings changed before it was kept: it is
    kept under the generation read first, so the next key has the new prefix."""
    read, changed = threading.Event(), threading.Event()

    class Pausing:
        def __getattr__(self, name: str) -> Any:
            value = getattr(settings, name)
            if name == "KEY_PREFIX" and threading.current_thread().name == "deciding":
                read.set()
                assert changed.wait(5)
            return value

    policy = Policy("heads", rate="5/m")
    with override_settings(REDISLUA={"KEY_PREFIX": "old"}):
        monkeypatch.setattr(definition, "settings", Pausing())
        thread = threading.Thread(target=lambda: policy.redis_key("x"), name="deciding")
        thread.start()
        assert read.wait(5)
        with override_settings(REDISLUA={"KEY_PREFIX": "new"}):
            changed.set()
            thread.join()
            assert policy.redis_key("x").startswith("new:")


def test_the_generation_moves_when_a_settings_callback_raises() -> None:
    """Whatever a callback raised, the settings did change: what was derived from them before
    is made again."""
    before = conf.generation

    def failing() -> None:
        raise RuntimeError("a callback's own bug")

    conf._on_change.insert(0, failing)
    try:
        with pytest.raises(RuntimeError), override_settings(REDISLUA={"KEY_PREFIX": "moved"}):
            pass
    finally:
        conf._on_change.remove(failing)
    assert conf.generation > before


def test_dict_and_list_settings_read_as_fresh_copies() -> None:
    policies = {"api": {"rate": "5/m"}}
    rules = [{"path": "/api/", "policy": "api"}]
    with override_settings(REDISLUA={"POLICIES": policies, "MIDDLEWARE_POLICIES": rules,
                                     "CONNECTION_OPTIONS": {"client_name": "web"}}):
        for name in ("POLICIES", "MIDDLEWARE_POLICIES", "CONNECTION_OPTIONS"):
            first = getattr(settings, name)
            first.clear()  # a caller changing its copy changes nothing else
            assert getattr(settings, name), name
    assert policies == {"api": {"rate": "5/m"}} and rules == [{"path": "/api/", "policy": "api"}]


def test_the_facade_is_read_only() -> None:
    with pytest.raises(AttributeError, match="override that instead"):
        settings.KEY_PREFIX = "x"  # type: ignore[misc]


def test_redislua_that_is_not_a_dict_reads_the_defaults() -> None:
    with override_settings(REDISLUA=["nope"]):
        assert settings.KEY_PREFIX == "rl" and settings.raw() == DEFAULTS
