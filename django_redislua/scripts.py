"""Lua scripts as package data: discovered, called by SHA, reloaded once on NOSCRIPT.

Every installed app may ship scripts in ``<app>/redislua/*.lua``; each is registered as
``"<app_label>.<file stem>"``. Files in ``<app>/redislua/lib/`` are fragments, not scripts: a
script pulls one in with a line ``--#include lib/name.lua``, so an algorithm written once can be
composed into several scripts. Every file starts with a comment stating its KEYS and ARGV. A
line ``--#per-call`` splits a script in two: as a Function, what is above it (the functions it
defines) runs once when the library loads and only what is below runs per call; ``EVALSHA``
runs the whole script every call.

Calls go by ``EVALSHA``; when the server answers ``NOSCRIPT`` (restart, ``SCRIPT FLUSH``, a new
node) the script is loaded and the call retried, once. With ``REDISLUA["USE_FUNCTIONS"]`` the
scripts are called as Redis 7 Functions (``FCALL``) from one versioned library instead.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from django_redislua import conf
from django_redislua.atransport import acurrent
from django_redislua.conf import settings
from django_redislua.protocol import unsent
from django_redislua.transport import current, transport_for

INCLUDE = re.compile(r"^--#include\s+(\S+)\s*$", re.MULTILINE)
# In a Functions library, a script's code above this line runs once, when the library loads.
PER_CALL = "\n--#per-call\n"


def _has_header(source: str) -> bool:
    """True when the file's leading comment block names both KEYS and ARGV."""
    lines = []
    for line in source.lstrip().splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    head = "\n".join(lines)
    return "KEYS" in head and "ARGV" in head


LIBRARY_PREFIX = "redislua_"

KeyArg = str | bytes
Arg = str | bytes | int | float


class AppNotInstalled(ImproperlyConfigured):
    """The app is used (a limit, a lock) but ``django_redislua`` is not in INSTALLED_APPS. No
    system check can say it (checks are registered by the app's own ``ready()``): the first
    use does; a request follows FAIL_OPEN, as for any failure of the limiter."""


class ScriptError(Exception):
    """A script file is malformed (missing include, no KEYS/ARGV header, unknown name)."""


def _expand(path: Path, root: Path, seen: tuple[Path, ...] = ()) -> str:
    if path in seen:
        raise ScriptError(f"{path}: include cycle through {', '.join(map(str, seen))}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScriptError(f"cannot read Lua file {path}: {exc}") from exc

    def include(match: re.Match[str]) -> str:
        target = (root / match.group(1)).resolve()
        if root.resolve() not in target.parents:
            raise ScriptError(f"{path}: include {match.group(1)!r} leaves {root}")
        return _expand(target, root, (*seen, path))

    return INCLUDE.sub(include, text)


class Script:
    """One registered script. Call it like a function: ``script(keys=[...], args=[...])``."""

    def __init__(self, name: str, source: str, path: Path | None = None) -> None:
        self.name = name
        self.source = source
        self.path = path
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        self.function_name = LIBRARY_PREFIX + re.sub(r"\W", "_", name)
        self._head: tuple[int, tuple[str, str]] = (-1, ("", ""))

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:12]}>"

    def __call__(
        self,
        keys: Sequence[KeyArg] = (),
        args: Sequence[Arg] = (),
        client: Any = None,
    ) -> Any:
        """Run the script: one ``EVALSHA`` (or ``FCALL``), sent once (see
        :mod:`django_redislua.transport`); on ``NOSCRIPT`` it is loaded and sent again, once.
        ``client``: a redis-py client (or any object with ``execute_command``) instead of the
        app's."""
        transport = current() if client is None else transport_for(client)
        return transport.call(self, self.command(keys, args))

    async def acall(
        self,
        keys: Sequence[KeyArg] = (),
        args: Sequence[Arg] = (),
    ) -> Any:
        """The asyncio twin of calling the script."""
        return await acurrent().call(self, self.command(keys, args))

    def command(self, keys: Sequence[KeyArg], args: Sequence[Arg]) -> tuple[Any, ...]:
        """The call as one command: :meth:`head`, the number of keys, the keys, the args."""
        return (*self.head(), len(keys), *keys, *args)

    def head(self) -> tuple[str, str]:
        """``("EVALSHA", sha)`` or ``("FCALL", function)``: a call is this, then the number of
        keys, the keys and the arguments. Cached per settings (it depends on USE_FUNCTIONS)."""
        cached = self._head
        if cached[0] != conf.generation:
            generation = conf.generation  # read first: a change while building makes it stale
            head = (("FCALL", function_name(self, registry.library()[0])) if settings.USE_FUNCTIONS
                    else ("EVALSHA", self.sha))
            cached = self._head = (generation, head)
        return cached[1]

    def load_command(self) -> tuple[str, ...]:
        """What loads the script where a call found it missing: ``SCRIPT LOAD`` it, or with
        ``USE_FUNCTIONS`` ``FUNCTION LOAD REPLACE`` the library of every script."""
        if settings.USE_FUNCTIONS:
            return ("FUNCTION LOAD", "REPLACE", registry.library()[1])
        return ("SCRIPT LOAD", self.source)  # redis-py sends a two-word name as two words


class Registry:
    """All scripts of all installed apps, discovered once (after apps are ready)."""

    def __init__(self) -> None:
        self._scripts: dict[str, Script] | None = None
        self._library: tuple[str, str] | None = None
        # Held while the scripts or the library are found and while they are cleared: a clear
        # (INSTALLED_APPS changed) waits for a discovery in progress under the old apps, then
        # drops what it found. Reentrant: the library is built from all().
        self._lock = threading.RLock()

    def _discover(self) -> dict[str, Script]:
        found: dict[str, Script] = {}
        for config in apps.get_app_configs():
            root = Path(config.path) / "redislua"
            if not root.is_dir():
                continue
            for path in sorted(root.glob("*.lua")):
                name = f"{config.label}.{path.stem}"
                source = _expand(path, root)
                if not _has_header(source):
                    raise ScriptError(f"{path} must start with a comment giving its KEYS and ARGV")
                found[name] = Script(name, source, path)
        return found

    def all(self) -> dict[str, Script]:
        scripts = self._scripts
        if scripts is None:
            with self._lock:
                if self._scripts is None:
                    self._scripts = self._discover()
                scripts = self._scripts
        return scripts

    def get(self, name: str) -> Script:
        try:
            return self.all()[name]
        except KeyError:
            if name.startswith("django_redislua.") and not apps.is_installed("django_redislua"):
                # Nothing was sent: a give-back of an acquire that failed here sends nothing
                # either (protocol.retried does not try it again).
                raise unsent(AppNotInstalled(
                    "django_redislua is not in INSTALLED_APPS: its scripts, system checks and "
                    "admin page are only found when it is. Add \"django_redislua\" to "
                    "INSTALLED_APPS in your settings (see "
                    "https://django-redislua.readthedocs.io/en/latest/quickstart.html)."
                )) from None
            known = ", ".join(sorted(self.all())) or "none"
            raise ScriptError(f"no script named {name!r} (known: {known})") from None

    def clear(self) -> None:
        with self._lock:
            self._scripts = None
            self._library = None

    def library(self) -> tuple[str, str]:
        """``(library name, source)`` of the versioned Redis Functions library of every script.

        The version is a digest of every script, so a rolling deploy can run old and new
        libraries side by side; function names carry it too, as Redis wants them unique.
        """
        library = self._library
        if library is not None:
            return library
        with self._lock:
            if self._library is None:
                self._library = self._build_library(self.all())
            return self._library

    @staticmethod
    def _build_library(scripts: dict[str, Script]) -> tuple[str, str]:
        digest = hashlib.sha1("".join(s.sha for s in scripts.values()).encode()).hexdigest()[:12]
        lib_name = f"{LIBRARY_PREFIX}{digest}"
        body = [f"#!lua name={lib_name}"]
        for script in scripts.values():
            # What comes before a script's PER_CALL line (its functions) runs once, when the
            # library loads; only what follows runs per call. Each script in its own block.
            prelude, marker, per_call = script.source.partition(PER_CALL)
            if not marker:
                prelude, per_call = "", script.source
            body.append(
                f"do\n{prelude}\nredis.register_function('{function_name(script, lib_name)}', "
                f"function(KEYS, ARGV)\n{per_call}\nend)\nend"
            )
        return lib_name, "\n".join(body)


registry = Registry()


@receiver(setting_changed)
def _installed_apps_changed(*, setting: str, **kwargs: Any) -> None:
    """Apps (and so their scripts) changed (``override_settings(INSTALLED_APPS=...)``)."""
    if setting == "INSTALLED_APPS":
        registry.clear()


def function_name(script: Script, lib_name: str) -> str:
    return f"{lib_name}__{script.function_name[len(LIBRARY_PREFIX) :]}"


def get_script(name: str) -> Script:
    """The registered script ``"app_label.name"``."""
    return registry.get(name)


