"""Every ```python block of README.md and docs/*.md, run against the suite's real Redis.

A page added later (docs/recipes.md, say) is picked up by the glob below. The conventions, as
docs/testing.md ("The docs' snippets") states them for writers:

- A page's blocks run in order, in one namespace, as one session would. Top-level ``await`` and
  ``async with`` are allowed (the block then runs in a fresh event loop).
- A block whose first line is ``# some/module.py`` is that module: its own namespace, importable
  by the page's later blocks (``from myapp import views``). A module that defines
  ``urlpatterns`` becomes ``ROOT_URLCONF`` for the rest of the page.
- Settings: the upper-case names a block assigns (a block without a file name, or a module whose
  name contains ``settings``) are applied with ``override_settings`` for the rest of the page.
  ``...`` in a list stands for what the setting already holds (``INSTALLED_APPS = [...,
  "django_redislua"]``). ``myproject.settings``, unless the page writes it, is this suite's
  settings module. ``redis://127.0.0.1:6379`` and ``redis://localhost:6379`` become the suite's
  server. After each change the system checks must report no ``redislua.*`` message and no
  error, and every configured policy is peeked on real Redis.
- ``def test_*`` functions are run, each as its own test here, after the page's blocks up to
  its own, with the fixtures their parameters name (``client``, ``async_client``,
  ``redislua``, ...).
- ``<!-- snippet: skip REASON -->`` on the line before a fence skips that block (a reason is
  required); ``<!-- snippets: tested-by tests/FILE.py ... -->`` hands the page to that test;
  ``<!-- snippets: need MODULE ... -->`` skips the page, saying so, where a module it imports
  (an optional extra's) is not installed.
"""

from __future__ import annotations

import ast
import asyncio
import gc
import importlib.util
import inspect
import re
import sys
import types
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.core.checks import ERROR, run_checks
from django.test import override_settings
from django.urls import clear_url_caches

from tests.versions import EXPECTED_WARNINGS

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(`{3,})(\S*)\s*$")
SKIP = re.compile(r"^<!--\s*snippet:\s*skip\b\s*(?P<reason>.*?)\s*-->\s*$")
TESTED_BY = re.compile(r"^<!--\s*snippets:\s*tested-by\s+(?P<path>\S+)", re.MULTILINE)
NEEDS = re.compile(r"^<!--\s*snippets:\s*need\s+(?P<modules>[\w. ]+?)\s*-->", re.MULTILINE)
MODULE = re.compile(r"^#\s*(?P<path>[\w/]+)\.py\s*$")
LOCAL_REDIS = re.compile(r"redis://(?:127\.0\.0\.1|localhost):6379")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the fence
    source: str
    skip: str | None  # the reason, when skipped
    module: str | None  # "myapp.views" for a block headed "# myapp/views.py"

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"

    @property
    def is_settings(self) -> bool:
        return self.module is None or "settings" in self.module.rsplit(".", 1)[-1]

    def test_functions(self) -> list[str]:
        tree = ast.parse(self.source)
        return [node.name for node in tree.body
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and node.name.startswith("test_")]


def read_blocks(page: Path) -> list[Block]:
    """Every block fenced exactly ```python (other languages are not run)."""
    blocks: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        fence, language, start = match[1], match[2], i
        i += 1
        body = []
        while i < len(lines) and lines[i].rstrip() != fence:
            body.append(lines[i])
            i += 1
        i += 1
        if language != "python":
            continue
        skip = None
        previous = lines[start - 1] if start else ""
        skipped = SKIP.match(previous)
        if skipped is not None:
            skip = skipped["reason"]
            assert skip, f"{page.name}:{start + 1}: a skipped snippet must say why"
        first = MODULE.match(body[0]) if body else None
        module = first["path"].replace("/", ".") if first else None
        blocks.append(Block(page, start + 1, "\n".join(body) + "\n", skip, module))
    return blocks


def handed_to(page: Path) -> str | None:
    match = TESTED_BY.search(page.read_text())
    return match["path"] if match else None


def missing_modules(page: Path) -> list[str]:
    """The modules a page says it needs (``<!-- snippets: need ... -->``) that are not
    installed here."""
    match = NEEDS.search(page.read_text())
    needed = match["modules"].split() if match else []
    return [name for name in needed if importlib.util.find_spec(name) is None]


def pages_with_blocks() -> list[Path]:
    return [page for page in PAGES if read_blocks(page)]


def snippet_tests() -> list[tuple[Path, int, str]]:
    """(page, index of its block, test function name) for every snippet test function."""
    found = []
    for page in pages_with_blocks():
        if handed_to(page):
            continue
        for index, block in enumerate(read_blocks(page)):
            if block.skip is None:
                found.extend((page, index, name) for name in block.test_functions())
    return found


# -- running a page ----------------------------------------------------------------------------
_MISSING = object()


def _expand(name: str, value: Any) -> Any:
    """``[..., "x"]``: the setting's current entries, then the new ones."""
    if isinstance(value, list | tuple) and any(v is Ellipsis for v in value):
        current = list(getattr(settings, name, []))
        added = [v for v in value if v is not Ellipsis and v not in current]
        return type(value)(current + added)
    return value


def _assigned_upper_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            while isinstance(target, ast.Subscript | ast.Attribute):
                target = target.value
            if isinstance(target, ast.Name) and target.id.isupper():
                names.add(target.id)
    return names


class PageRun:
    """Runs a page's blocks; settings, modules and URLconfs last until ``stack`` closes."""

    def __init__(self, page: Path, stack: ExitStack, redis_url: str) -> None:
        self.page = page
        self.stack = stack
        self.server = "{0.scheme}://{0.netloc}".format(urlsplit(redis_url))
        self.namespace: dict[str, Any] = {"__name__": f"docs_snippets.{page.stem}"}
        self.modules: dict[str, types.ModuleType] = {}
        stack.callback(self._forget_namespace)  # last: after the page's settings are undone
        saved = {name: sys.modules.get(name) for name in ("myproject", "myproject.settings")}
        stack.callback(self._forget_modules, saved)
        if not any(b.module == "myproject.settings" for b in read_blocks(page)):
            import tests.settings

            self._register("myproject.settings", tests.settings)
        # The page's project routes nothing until a block writes its urls.py (the suite's own
        # URLconf names the suite's policies, which a page's REDISLUA does not have).
        no_urls = types.ModuleType("docs_snippets_urls")
        no_urls.urlpatterns = []  # type: ignore[attr-defined]
        self._register("docs_snippets_urls", no_urls)
        stack.enter_context(override_settings(ROOT_URLCONF="docs_snippets_urls"))

    def _register(self, name: str, module: types.ModuleType) -> None:
        parts = name.split(".")
        for depth in range(1, len(parts)):
            parent = ".".join(parts[:depth])
            if parent not in self.modules:
                package = types.ModuleType(parent)
                package.__path__ = []
                self.modules[parent] = package
                sys.modules[parent] = package
        self.modules[name] = module
        sys.modules[name] = module
        if len(parts) > 1:
            setattr(self.modules[".".join(parts[:-1])], parts[-1], module)

    def _forget_namespace(self) -> None:
        """What the page's blocks made dies with the page, not at some later full collection:
        its functions and its namespace are a cycle, and some objects are known while alive
        (a ``JobGate`` is checked by ``manage.py check``: a later page's settings would fail
        E021 for it). The suite freezes what is alive as each module starts (tests/conftest.py,
        ``_short_gc_pauses``), which would keep such a cycle for the whole session."""
        self.namespace.clear()
        gc.collect()

    def _forget_modules(self, saved: dict[str, types.ModuleType | None]) -> None:
        for name in self.modules:
            sys.modules.pop(name, None)
        for name, module in saved.items():
            if module is not None:
                sys.modules[name] = module
        clear_url_caches()

    def run(self, block: Block) -> dict[str, Any]:
        """Execute one block; return the namespace it ran in."""
        source = LOCAL_REDIS.sub(self.server, block.source)
        tree = ast.parse(source)
        if block.module is None:
            namespace = self.namespace
        else:
            module = types.ModuleType(block.module)
            module.__file__ = f"<{block.where}>"
            namespace = module.__dict__
        code = compile(source, f"<{block.where}>", "exec",
                       flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        result = eval(code, namespace)  # exec, with top-level await allowed
        if inspect.iscoroutine(result):
            asyncio.run(result)
        if block.module is not None:
            self._register(block.module, module)
        self._apply(block, tree, namespace)
        return namespace

    def _apply(self, block: Block, tree: ast.Module, namespace: dict[str, Any]) -> None:
        changed: dict[str, Any] = {}
        if block.is_settings:
            names = _assigned_upper_names(tree)
            if block.module is not None:  # a settings module: everything it holds counts
                names |= {n for n in namespace if n.isupper() and not n.startswith("_")}
            for name in sorted(names):
                value = _expand(name, namespace[name])
                if value != getattr(settings, name, _MISSING):
                    changed[name] = value
        if block.module is not None and "urlpatterns" in namespace:
            changed["ROOT_URLCONF"] = block.module
            clear_url_caches()
        if not changed:
            return
        self.stack.enter_context(override_settings(**changed))
        problems = [
            f"{m.id}: {m.msg}" for m in run_checks()
            if ((m.id or "").startswith("redislua.") or m.level >= ERROR)
            and m.id not in EXPECTED_WARNINGS
        ]
        assert not problems, f"{block.where}: the settings fail the system checks: {problems}"
        if {"REDISLUA", "CACHES"} & set(changed):
            self._peek_policies(block)

    def _peek_policies(self, block: Block) -> None:
        from django_redislua import get_policy

        for name in getattr(settings, "REDISLUA", {}).get("POLICIES", {}):
            policy = get_policy(name)
            if not policy.is_dynamic:
                decision = policy.peek("docs-snippets")
                assert decision.limit >= 0, (block.where, name)


@pytest.fixture
def page_stack() -> Iterator[ExitStack]:
    """Closed after every fixture a snippet test asks for (those are set up later)."""
    with ExitStack() as stack:
        yield stack


@pytest.fixture
def redis_url() -> str:
    from tests.settings import REDIS_URL

    return REDIS_URL


@pytest.mark.parametrize("page", pages_with_blocks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_page_runs(page: Path, page_stack: ExitStack, redis_url: str) -> None:
    """Every block of the page, in order (test functions are defined, and run below)."""
    missing = missing_modules(page)
    if missing:
        pytest.skip(f"{page.name} needs {', '.join(missing)} (an optional extra)")
    handed = handed_to(page)
    if handed is not None:
        test = ROOT / handed
        assert test.is_file(), f"{page.name} names {handed}, which does not exist"
        assert page.name in test.read_text(), f"{handed} does not read {page.name}"
        return
    run = PageRun(page, page_stack, redis_url)
    for block in read_blocks(page):
        if block.skip is None:
            run.run(block)


@pytest.mark.parametrize(
    ("page", "index", "name"), snippet_tests(),
    ids=[f"{p.relative_to(ROOT)}::{n}" for p, _, n in snippet_tests()],
)
def test_snippet_test_passes(
    page: Path, index: int, name: str, page_stack: ExitStack, redis_url: str,
    request: pytest.FixtureRequest,
) -> None:
    """A ``def test_*`` of the docs, run after the page's blocks up to its own, with the
    fixtures it names."""
    run = PageRun(page, page_stack, redis_url)
    blocks = read_blocks(page)
    namespace: dict[str, Any] = {}
    for block in blocks[: index + 1]:
        if block.skip is None:
            namespace = run.run(block)
    function = namespace[name]
    arguments = {p: request.getfixturevalue(p) for p in inspect.signature(function).parameters}
    if inspect.iscoroutinefunction(function):
        asyncio.run(function(**arguments))
    else:
        function(**arguments)


# -- the conventions themselves ----------------------------------------------------------------


def test_what_a_page_made_dies_with_it(redis_url: str) -> None:
    """A job gate a page's block made is no longer known once the page ends, even with the
    collector off (as for what the suite has frozen): a later page's checks never see it."""
    from django_redislua.jobs.gate import known_gates

    source = ('from django_redislua.jobs import JobGate\n'
              'gate = JobGate("a-page-gate")\n'
              'def admit():\n'
              '    return gate\n')  # a function: the namespace and it are a cycle
    block = Block(ROOT / "docs" / "jobs.md", 1, source, None, None)
    gc.disable()
    try:
        with ExitStack() as stack:
            PageRun(block.page, stack, redis_url).run(block)
            assert "a-page-gate" in [gate.name for gate in known_gates()]
        assert "a-page-gate" not in [gate.name for gate in known_gates()]
    finally:
        gc.enable()
def test_every_page_is_read() -> None:
    assert ROOT / "README.md" in PAGES
    assert {p.name for p in PAGES} >= {"index.md", "tutorial.md", "testing.md"}
    # The README's quickstart defines its test: the runner does find and run test functions.
    assert any(name.startswith("test_the_fourth_hello") for _, _, name in snippet_tests())


def test_skips_are_rare_and_say_why() -> None:
    skipped = [b for page in PAGES for b in read_blocks(page) if b.skip is not None]
    assert all(b.skip for b in skipped)
    run = [b for page in PAGES if not handed_to(page) for b in read_blocks(page)]
    assert len(skipped) <= max(2, len(run) // 10), [b.where for b in skipped]


def test_a_wrong_snippet_fails(tmp_path: Path, page_stack: ExitStack, redis_url: str) -> None:
    """The runner is not lenient: a snippet with a broken policy fails the checks."""
    page = tmp_path / "broken.md"
    page.write_text('```python\nREDISLUA = {"POLICIES": {"p": {"rate": "5/fortnight"}}}\n```\n')
    run = PageRun(page, page_stack, redis_url)
    with pytest.raises(AssertionError, match=r"redislua\.E00"):
        run.run(read_blocks(page)[0])


def test_the_conventions_are_documented() -> None:
    text = (ROOT / "docs" / "testing.md").read_text()
    for rule in ("snippet: skip", "snippets: tested-by", "snippets: need", "# myapp/views.py",
                 "urlpatterns",
                 "myproject.settings", "redis://127.0.0.1:6379", "def test_"):
        assert rule in text, rule
