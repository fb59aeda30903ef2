"""``manage.py demo``: migrate, create the admin/admin superuser, serve on 127.0.0.1:8000.

Ctrl-C stops it without a traceback, whenever it comes: runserver ends on it by itself, and an
interrupt while the demo is still preparing ends here. The embedded Redis (demo/settings.py)
stops with the process.
"""

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
        # No autoreloader: its child would be a second process; the embedded Redis lives here.
        call_command("runserver", addrport, use_reloader=False)
