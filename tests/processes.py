"""Shared by the tests that drive real processes: server processes (gunicorn, uvicorn) and the
children of the multi-process tests (``CHILDREN``)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess

# The multi-process tests' children (locks, run_once, recipes) come from multiprocessing's fork
# server (Python 3.14's default on Linux), which has imported Django, the app and those tests'
# modules and set Django up once (tests/forkserver_setup.py): each child is a fork of that
# clean, single-threaded process, with no Redis client, connection or thread of its own yet.
# A spawned child did all that itself, ~1.2 s of CPU each (some fifty children a run); a fork
# of the test worker would share its threads, sockets and pools.
CHILDREN = multiprocessing.get_context("forkserver")
CHILDREN.set_forkserver_preload(["tests.forkserver_setup"])


def setup_django(connection: str | None = None) -> None:
    """In a child: Django on the test settings (set up already when the child comes from the
    fork server; a no-op then), the app's Redis at ``connection`` when given (the parent's:
    its worker's server, or the cluster in a cluster run)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    from tests import settings as test_settings

    if connection is not None:
        test_settings.REDISLUA["CONNECTION"] = connection
    import django

    django.setup()
    if connection is not None:
        from django_redislua.conf import settings as conf

        # The fork server set Django up before the connection was known: nothing may have
        # read and kept the settings' connection by then.
        assert connection == conf.CONNECTION, (conf.CONNECTION, connection)


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group of a server started with ``start_new_session=True``; SIGKILL
    it if it has not exited within 15 s."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
