"""``manage.py redislua_locks [--match TEXT] [--release NAME]``: list held locks, or free one."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_redislua.locks.inspect import force_release, scan_locks
from django_redislua.management import redis_errors_as_command_errors

HEADER = ("NAME", "OWNER", "TTL", "TOKEN", "COUNT", "WAITERS")


class Command(BaseCommand):
    help = "List held locks (owner, TTL, fencing token, re-entries, waiters), read with SCAN."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--match", help="only locks whose name contains this (or a glob)")
        parser.add_argument("--release", metavar="NAME",
                            help="delete the lock NAME whoever holds it, and wake its waiters")

    def handle(self, *args: Any, **options: Any) -> None:
        with redis_errors_as_command_errors():
            self._handle(options)

    def _handle(self, options: dict[str, Any]) -> None:
        name = options["release"]
        if name is not None:
            if not force_release(name):
                raise CommandError(f"lock {name!r} is not held")
            self.stdout.write(self.style.SUCCESS(f"released {name}"))
            return
        rows: list[tuple[str, ...]] = []
        cursor = 0
        while True:
            cursor, page = scan_locks(cursor, match=options["match"])
            rows.extend(
                (info.name, info.owner, "-" if info.ttl is None else f"{info.ttl:.3f}s",
                 str(info.fencing_token), str(info.reentry_count), str(info.waiters))
                for info in page
            )
            if cursor == 0:
                break
        if not rows:
            self.stdout.write("no locks held")
            return
        rows.sort()
        widths = [max(len(row[i]) for row in [HEADER, *rows]) for i in range(len(HEADER))]
        for row in [HEADER, *rows]:
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths,
                                                                                   strict=True)))
