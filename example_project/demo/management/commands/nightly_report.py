"""``manage.py nightly_report``: what cron starts on every host; the report goes out once a day.

Run it twice: the first says it ran the report, the second who did and when (docs/jobs.md).
"""

from typing import Any

from django.core.management.base import BaseCommand

from django_redislua.jobs import once_per


@once_per("day", name="demo:nightly-report", tz="Europe/Paris", timeout="30s")
def send_nightly_report() -> str:
    return "report sent"


class Command(BaseCommand):
    help = "Send today's report, unless a host already did (once per day, Europe/Paris)."

    def handle(self, *args: Any, **options: Any) -> None:
        outcome = send_nightly_report()
        if outcome.status == "ran":
            self.stdout.write(f"ran: {outcome.result}")
        elif outcome.status == "done":
            self.stdout.write(f"done already today: by {outcome.ran_by} at "
                              f"{outcome.finished_at:%H:%M:%S} UTC")
        else:
            self.stdout.write(f"running now: on {outcome.ran_by}")
