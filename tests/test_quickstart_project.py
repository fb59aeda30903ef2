"""README's quickstart, followed as a new user follows it: ``startproject`` and ``startapp``, the
README's files written where its blocks say, then its commands in processes of their own
(``check``, ``migrate``, ``runserver``, requests over HTTP, ``pytest``).

The blocks are read from README.md itself, so the page cannot drift from what works. The only
change to them is the Redis URL (the suite's server instead of 127.0.0.1:6379).
"""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from django_redislua.testing import free_port
from tests.processes import stop_group

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BOOT_TIMEOUT = 40.0


def quickstart_blocks() -> dict[str, tuple[str, str]]:
    """The quickstart's code blocks that name their file on their first line (``# myapp/views.py``):
    file -> (language, the block without that line)."""
    text = README.read_text(encoding="utf-8")
    start = text.index("<!-- quickstart: start")
    end = text.index("<!-- quickstart: end")
    blocks: dict[str, tuple[str, str]] = {}
    for language, body in re.findall(r"```(\w+)\n(.*?)```", text[start:end], re.S):
        first, _, rest = body.partition("\n")
        named = re.fullmatch(r"# (\S+\.(?:py|ini))", first)
        if named:
            blocks[named.group(1)] = (language, rest)
    return blocks


def project_env() -> dict[str, str]:
    """The environment of a user's shell: none of this suite's Django or pytest settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DJANGO_", "PYTEST_")) and k != "REDIS_URL"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run(project: Path, *args: str, timeout: float = 120) -> str:
    result = subprocess.run([sys.executable, *args], cwd=project, env=project_env(),
                            capture_output=True, text=True, timeout=timeout)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(args)}:\n{output}"
    return output


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project made by ``startproject``/``startapp`` with the quickstart's files in it."""
    project = tmp_path_factory.mktemp("quickstart")
    run(project, "-m", "django", "startproject", "myproject", ".")
    run(project, "manage.py", "startapp", "myapp")
    blocks = quickstart_blocks()
    assert set(blocks) == {"myproject/settings.py", "myapp/views.py", "myproject/urls.py",
                           "myapp/tests.py", "pytest.ini"}, sorted(blocks)

    # Step 1 as written: "keep your apps; add this one", then the cache and REDISLUA.
    _, given = blocks["myproject/settings.py"]
    added = re.search(r'INSTALLED_APPS = \[\.\.\., "(\w+)"\]', given)
    assert added is not None, given
    settings_py = project / "myproject" / "settings.py"
    generated = settings_py.read_text()
    generated = generated.replace('INSTALLED_APPS = [\n',
                                  f'INSTALLED_APPS = [\n    "{added.group(1)}",\n', 1)
    rest = given[:added.start()] + given[added.end():]
    assert "redis://127.0.0.1:6379" in rest
    settings_py.write_text(generated + "\n" + rest.replace("redis://127.0.0.1:6379",
                                                           settings.REDIS_URL))
    for name in ("myapp/views.py", "myproject/urls.py", "myapp/tests.py", "pytest.ini"):
        (project / name).write_text(blocks[name][1])
    return project


def test_check_then_migrate_as_the_quickstart_says(project: Path) -> None:
    assert "System check identified no issues" in run(project, "manage.py", "check")
    migrated = run(project, "manage.py", "migrate", "--noinput")
    assert "Applying django_redislua.0001_initial... OK" in migrated


@pytest.fixture
def runserver(project: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    run(project, "manage.py", "migrate", "--noinput")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=project, env=project_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        deadline = time.monotonic() + BOOT_TIMEOUT
        while True:
            try:
                http.client.HTTPConnection("127.0.0.1", port, timeout=2).connect()
                break
            except OSError:
                assert process.poll() is None, process.communicate()[0].decode()
                assert time.monotonic() < deadline, "runserver did not start"
                time.sleep(0.2)
        yield port, process
    finally:
        stop_group(process)


def get(port: int, path: str) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", path)
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


def test_runserver_answers_as_the_readme_shows(
    runserver: tuple[int, subprocess.Popen[bytes]],
) -> None:
    port, process = runserver
    responses = [get(port, "/hello/") for _ in range(4)]
    assert [r.status for r in responses] == [200, 200, 200, 429]
    allowed, denied = responses[0], responses[3]
    assert allowed.getheader("RateLimit-Policy") == '"hello";q=3;w=60'
    assert denied.getheader("RateLimit-Policy") == '"hello";q=3;w=60'
    assert (denied.getheader("RateLimit") or "").startswith('"hello";r=0;t=')
    assert 0 < int(denied.getheader("Retry-After") or 0) <= 60
    # The admin route is kept: its login page, which the app's "Redis Lua" page sits behind.
    assert get(port, "/admin/").status == 302
    stop_group(process)
    log = process.communicate()[0].decode()
    # migrate was run as step 4 says: runserver has nothing to warn about.
    assert "unapplied migration" not in log, log
    assert "Traceback" not in log, log


def test_the_quickstart_test_passes_under_pytest(project: Path) -> None:
    """Step 5: ``pytest`` in the project, with the README's pytest.ini, finds the test in
    ``myapp/tests.py`` and passes it on the plugin's throwaway server."""
    # pytest-asyncio, installed here for the suite, is not in the quickstart's install line
    # (and warns about its own unset option).
    output = run(project, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:asyncio",
                 timeout=300)
    assert re.search(r"\b1 passed\b", output), output
    assert "warning" not in output.lower(), output
