"""The distributions: built from this checkout, checked as PyPI would check them.

``python -m build --no-isolation`` (this environment's setuptools, so it needs no network and
takes seconds) builds the sdist and the wheel; ``twine check`` validates their metadata and the
README's rendering. The wheel must carry every script, fragment, template and static file of the
package (a new subpackage's too), and nothing of the tests or the example project. The build must
print no deprecation warning (PEP 639 licence metadata).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_redislua"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return wheel, sdist, log


def test_the_build_prints_no_deprecation_warning(dist: tuple[Path, Path, str]) -> None:
    log = dist[2]
    assert "Successfully built" in log
    assert "deprecat" not in log.lower(), [line for line in log.splitlines()
                                            if "eprecat" in line]


def test_twine_check_passes(dist: tuple[Path, Path, str]) -> None:
    wheel, sdist, _ = dist
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def package_files(*patterns: str) -> set[str]:
    found = set()
    for pattern in patterns:
        for path in PACKAGE.rglob(pattern):
            if path.is_file() and "__pycache__" not in path.parts:
                found.add(path.relative_to(ROOT).as_posix())
    return found


def test_the_wheel_holds_every_script_template_and_static_file(
    dist: tuple[Path, Path, str],
) -> None:
    names = set(zipfile.ZipFile(dist[0]).namelist())
    lua = package_files("*.lua")
    assert {"django_redislua/redislua/ratelimit.lua",
            "django_redislua/redislua/lib/gcra.lua"} <= lua
    templates = package_files("templates/**/*")
    static = package_files("static/**/*")
    assert templates and static
    assert not (lua | templates | static | {"django_redislua/py.typed"}) - names
    assert not package_files("*.py") - names  # and every module


def test_the_wheel_holds_no_tests_and_no_example(dist: tuple[Path, Path, str]) -> None:
    names = zipfile.ZipFile(dist[0]).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"django_redislua", f"{dist[0].name.split('-')[0]}-"
                    f"{dist[0].name.split('-')[1]}.dist-info"}, tops
    assert not [n for n in names if "/tests/" in n or "example_project" in n]


def test_the_metadata(dist: tuple[Path, Path, str]) -> None:
    with zipfile.ZipFile(dist[0]) as wheel:
        (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(wheel.read(name).decode())
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in wheel.namelist())
    assert metadata["License-Expression"] == "BSD-3-Clause"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert not [c for c in metadata.get_all("Classifier") if c.startswith("License ::")]
    classifiers = set(metadata.get_all("Classifier"))
    python = {c for c in classifiers if c.startswith("Programming Language :: Python :: 3.")}
    assert python == {f"Programming Language :: Python :: {v}" for v in ("3.11", "3.12", "3.13")}
    assert metadata["Requires-Python"] == ">=3.11"
    django = {c for c in classifiers if c.startswith("Framework :: Django :: ")}
    assert django == {f"Framework :: Django :: {v}" for v in ("5.2", "6.0", "6.1")}  # tox's envs
    assert set(metadata.get_all("Requires-Dist")) >= {"Django>=5.2", "redis>=5.0.1"}
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL"))
    assert urls["Documentation"].startswith("https://")
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert "pip install django-redislua" in metadata.get_payload()
    extras = set(metadata.get_all("Provides-Extra"))
    assert {"drf", "hiredis", "prometheus", "docs"} <= extras


def test_the_sdist_builds_the_same_package(dist: tuple[Path, Path, str]) -> None:
    with tarfile.open(dist[1]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {"LICENSE", "README.md", "pyproject.toml"} <= names
    assert {p for p in package_files("*.lua")} <= names
