"""Shared by the tests that drive real server processes (gunicorn, uvicorn)."""

from __future__ import annotations

import os
import signal
import subprocess


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
