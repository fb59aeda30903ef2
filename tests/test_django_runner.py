"""The unittest side of the testing support (``django_redislua.test``), run as a project runs
it: ``python -m django test`` in a process of its own, on tests/runner_cases.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_manage_py_test_runs_the_mixin_and_the_decorator() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-W", "error", "-m", "django", "test", "tests.runner_cases", "-v", "2",
         "--noinput"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Ran 6 tests" in output and "\nOK" in output, output
    for name in ("test_the_fourth_request_in_a_minute_is_refused",
                 "test_each_test_starts_with_every_limit_forgotten",
                 "test_reset_forgets_every_limit", "test_limits_and_advance",
                 "test_the_server_is_empty_when_a_test_starts",
                 "test_the_throwaway_server_is_not_the_one_in_the_settings"):
        assert f"{name} " in output and "... ok" in output, (name, output)
