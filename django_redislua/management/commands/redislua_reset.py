"""``manage.py redislua_reset <policy> <identity>``: forget one identity's state in a policy."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_redislua.limiting import PolicyError, get_policy
from django_redislua.management import redis_errors_as_command_errors


class Command(BaseCommand):
    help = "Delete the rate-limit state of one identity (e.g. an IP or 'u42') in one policy."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("policy", help="a policy name from REDISLUA['POLICIES']")
        parser.add_argument("identity", help="the identity the policy's key function produced")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            policy = get_policy(options["policy"])
        except PolicyError as exc:
            raise CommandError(f"{exc} ({exc.check_id})") from None
        key = policy.redis_key(options["identity"])
        with redis_errors_as_command_errors():
            policy.reset(options["identity"])
        self.stdout.write(self.style.SUCCESS(f"reset {key}"))
