"""``manage.py redislua_reset <policy> <identity>``: forget one identity's state in a policy."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_redislua.discovery import policies_in_use
from django_redislua.management import redis_errors_as_command_errors


class Command(BaseCommand):
    help = (
        "Delete the rate-limit state of one identity (e.g. an IP or 'u42') in one policy: one "
        "from REDISLUA['POLICIES'], an inline @ratelimit on a routed view, or a DRF scope."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("policy", help="a policy name, as the admin page and headers show it")
        parser.add_argument("identity", help="the identity the policy's key function produced")

    def handle(self, *args: Any, **options: Any) -> None:
        name, identity = options["policy"], options["identity"]
        with redis_errors_as_command_errors():
            in_use = policies_in_use()
            if name not in in_use:
                known = ", ".join(in_use) or "none"
                raise CommandError(f"no policy named {name!r} is in use (known: {known})")
            policy = in_use[name].policy
            key = policy.redis_key(identity)
            if policy.reset(identity):
                self.stdout.write(self.style.SUCCESS(f"reset {key}"))
            else:
                self.stdout.write(f"nothing to reset: {key} holds no state")
