"""The docs site: built with ``-W`` as CI builds it (no network needed), and checked.

The build is the one ``tox -e docs`` and Read the Docs run (docs/conf.py). On top of Sphinx's own
warnings, this checks what Sphinx lets through: every link between pages and every anchor it
names exists (MyST's missing-reference warnings are silenced in conf.py for source-path links),
the README's links land on built pages, every URL the package prints (check hints) exists, and
the reference is complete: every public name, setting, check id and management command.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.core.management import get_commands

import django_redislua
from django_redislua.conf import DEFAULTS
from django_redislua.links import DOCS_URL, check_url, docs_url

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# Module -> its public names (None: the module's __all__). The contract's modules.
PUBLIC: dict[str, list[str] | None] = {
    "django_redislua": None,
    "django_redislua.limiting": None,
    "django_redislua.decorators": ["ratelimit"],
    "django_redislua.middleware": ["RateLimitMiddleware"],
    "django_redislua.signals": ["rate_limited"],
    "django_redislua.drf": None,
    "django_redislua.locks": None,
    "django_redislua.scripts": ["get_script", "Script", "ScriptError"],
    "django_redislua.compat": None,
    "django_redislua.pytest_plugin": ["redislua", "redislua_server"],
    "django_redislua.test": ["RedisLuaTestMixin", "redislua_test", "RedisLuaFixture"],
    "django_redislua.testing": ["RedisServer", "RedisClusterServers", "RedisSentinelServers",
                                "CommandRecorder", "find_server_binary", "shared_server_url"],
    "django_redislua.recipes": None,
}
RECIPES = ["CappedCounter", "Inventory", "WorkQueue", "VersionedCache", "WindowStats"]


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            if name in ("href", "src") and value and tag in ("a", "img"):
                self.links.append(value)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Page]:
    out = tmp_path_factory.mktemp("docs")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html",
         "-d", str(out / ".doctrees"), str(DOCS), str(out / "html")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert result.stderr == "", result.stderr
    pages = {}
    for path in (out / "html").rglob("*.html"):
        page = Page()
        page.feed(path.read_text())
        pages[path.relative_to(out / "html").as_posix()] = page
    for path in (out / "html").rglob("*"):
        if path.is_file() and not path.name.endswith(".html"):
            pages.setdefault(path.relative_to(out / "html").as_posix(), Page())
    return pages


def resolve(site: dict[str, Page], base: str, link: str) -> str | None:
    """The problem with ``link`` found on page ``base``, or None when it lands."""
    target, _, anchor = link.partition("#")
    if target:
        path = (Path(base).parent / target).as_posix()
        parts: list[str] = []
        for part in path.split("/"):
            if part == "..":
                parts.pop()
            elif part not in (".", ""):
                parts.append(part)
        target = "/".join(parts)
    else:
        target = base
    if target not in site:
        return f"{base}: {link} (no {target})"
    if anchor and anchor not in site[target].ids:
        return f"{base}: {link} (no #{anchor} in {target})"
    return None


def test_every_link_between_pages_lands(site: dict[str, Page]) -> None:
    broken = []
    for base, page in site.items():
        if base.startswith(("_modules/", "_static/", "genindex", "search")):
            continue
        for link in page.links:
            if re.match(r"^[a-z][a-z0-9+.-]*:", link):  # https:, mailto:
                continue
            problem = resolve(site, base, link)
            if problem:
                broken.append(problem)
    assert not broken, broken


def test_the_readme_links_land(site: dict[str, Page]) -> None:
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(docs/([\w-]+)\.md(#[\w-]+)?\)", text)
    assert len(links) > 10
    broken = [resolve(site, "index.html", f"{page}.html{anchor}") for page, anchor in links]
    assert not [b for b in broken if b], broken


def test_every_url_the_package_prints_exists(site: dict[str, Page]) -> None:
    """Check hints (``check_url``) and any other ``docs_url(...)`` in the package."""
    package = ROOT / "django_redislua"
    urls = set()
    for source in package.rglob("*.py"):
        text = source.read_text()
        urls |= {check_url(i) for i in re.findall(r"redislua\.[EW]\d{3}", text)}
        urls |= {docs_url(page, anchor)
                 for page, anchor in re.findall(r'docs_url\("([\w-]+)"(?:, "([\w-]+)")?\)', text)}
    assert len(urls) > 20
    missing = [u for u in urls
               if resolve(site, "index.html", u.removeprefix(DOCS_URL)) is not None]
    assert not missing, missing


def test_every_public_name_is_in_the_api_reference(site: dict[str, Page]) -> None:
    ids = site["api.html"].ids
    missing = []
    for name, public in PUBLIC.items():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            assert name == "django_redislua.recipes"  # being written: docs/conf.py tolerates it
            continue
        if public is None:
            public = list(getattr(module, "__all__", RECIPES))
        for attr in public:
            obj = getattr(module, attr)
            candidates = {f"{name}.{attr}", f"{getattr(obj, '__module__', '')}.{attr}"}
            if getattr(django_redislua, attr, None) is obj:  # documented where users import it
                candidates.add(f"django_redislua.{attr}")
            if not candidates & ids:
                missing.append(f"{name}.{attr}")
    assert not missing, missing


def test_every_setting_check_and_command_is_documented(site: dict[str, Page]) -> None:
    settings_page = (DOCS / "settings.md").read_text()
    assert not [k for k in DEFAULTS if f"`{k}`" not in settings_page]
    commands = [c for c, app in get_commands().items() if app == "django_redislua"]
    assert sorted(commands) == ["redislua_locks", "redislua_override", "redislua_preload",
                                "redislua_reset", "redislua_status"]
    text = (DOCS / "commands.md").read_text()
    assert all(f"{{command-help}} {c}" in text for c in commands)
    assert {c.replace("_", "-") for c in commands} <= site["commands.html"].ids


def test_the_algorithm_charts_are_drawn(site: dict[str, Page]) -> None:
    images = {link for link in site["algorithms.html"].links if link.endswith(".png")}
    names = {"overview", "fixed_window", "sliding_log", "sliding_window", "token_bucket",
             "leaky_bucket", "gcra", "concurrency"}
    assert {Path(i).stem for i in images} >= names, images
    assert not [i for i in images if resolve(site, "algorithms.html", i)]
