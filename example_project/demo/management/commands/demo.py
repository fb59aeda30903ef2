"""``manage.py demo``: migrate, create the admin/admin superuser, serve on 127.0.0.1:8000, with
a Celery worker beside it when Celery is installed (the /jobs/ page sends it tasks).

Ctrl-C stops it without a traceback, whenever it comes: runserver ends on it by itself, and an
interrupt while the demo is still preparing ends here. The embedded Redis (demo/settings.py)
stops with the process.
"""

import contextlib
import importlib.util
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Prepare and serve the demo project on 127.0.0.1:8000 with its embedded Redis."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self.serve(options["addrport"])
        except KeyboardInterrupt:
            self.stdout.write("Stopped.")

    def serve(self, addrport: str) -> None:
        from django.conf import settings

        call_command("migrate", verbosity=0)
        user_model = get_user_model()
        if not user_model.objects.filter(username="admin").exists():
            user_model.objects.create_superuser("admin", "admin@example.com", "admin")
        call_command("redislua_preload", verbosity=0)
        self.stdout.write(f"Redis: {settings.REDIS_URL}  ·  admin: admin / admin")
        worker = start_worker()
        if worker is not None:
            self.stdout.write(f"Celery worker: pid {worker.pid} (the /jobs/ page)")
        try:
            # No autoreloader: its child would be a second process; the embedded Redis lives
            # here.
            call_command("runserver", addrport, use_reloader=False)
        finally:
            if worker is not None:
                stop_worker(worker)


def start_worker() -> subprocess.Popen[bytes] | None:
    """A Celery worker of demo/celery.py on the demo's Redis (REDIS_URL is in the environment
    it inherits), or None without Celery. In a session of its own, so a terminal's Ctrl-C
    reaches the demo alone, which stops it; and stopped by the kernel if the demo dies."""
    if importlib.util.find_spec("celery") is None:
        return None
    project = Path(__file__).resolve().parents[3]
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-q", "-A", "demo.celery", "worker", "--concurrency",
         "2", "--loglevel", "WARNING", "--without-gossip", "--without-mingle"],
        cwd=project, start_new_session=True, preexec_fn=_die_with_parent)


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    worker.send_signal(signal.SIGTERM)  # Celery's warm shutdown: running tasks finish
    try:
        worker.wait(10)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):  # Linux only: PR_SET_PDEATHSIG
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
