"""``manage.py redislua_preload [--functions] [--check]``: scripts on every primary, and
reported (script cache: loaded too) on every replica."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_redislua.functions import FunctionsUnsupported, load_functions, load_scripts
from django_redislua.management import redis_errors_as_command_errors


class Command(BaseCommand):
    help = (
        "Load every registered Lua script on every Redis primary (SCRIPT LOAD), or as one "
        "versioned Redis 7 Function library with --functions. --check only reports; exit 1 when "
        "anything is missing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--functions",
            action="store_true",
            help="load a Redis 7 Functions library instead of the script cache",
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="load nothing; report what is missing and exit 1 if anything is",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            with redis_errors_as_command_errors():
                if options["functions"]:
                    report = load_functions(check_only=options["check"])
                else:
                    report = load_scripts(check_only=options["check"])
        except FunctionsUnsupported as exc:
            raise CommandError(str(exc)) from None
        width = max((len(r.name) for r in report), default=4)
        for row in report:
            style = (self.style.ERROR if row.status == "missing"
                     else self.style.WARNING if row.status == "unreachable"
                     else self.style.SUCCESS)
            self.stdout.write(f"{row.node}  {row.name:<{width}}  {row.sha}  {style(row.status)}")
        missing = [r for r in report if r.status == "missing"]
        if missing:
            names = ", ".join(sorted({r.name for r in missing}))
            raise CommandError(f"{len(missing)} missing: {names}", returncode=1)
