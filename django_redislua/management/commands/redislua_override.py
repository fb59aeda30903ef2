"""``manage.py redislua_override``: block, allow or re-rate one identity live (an incident
runbook's commands; see docs/overrides.md)."""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_redislua import overrides
from django_redislua.discovery import policies_in_use
from django_redislua.limiting.policy import Policy
from django_redislua.limiting.rates import RateError
from django_redislua.management import redis_errors_as_command_errors


class Command(BaseCommand):
    help = (
        "Live overrides of one identity (an IP, 'u42': what the policy's key function yields), "
        "honoured by every app server at its next decision: block, allow, rate, clear, list."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        for action, what in (("block", "refuse it, consuming nothing"),
                             ("allow", "admit it, consuming nothing")):
            sub = actions.add_parser(action, help=f"{what}, for --ttl")
            sub.add_argument("policy", help='a policy in use, or "*" for every policy')
            sub.add_argument("identity")
            self._lasting(sub)
        rate = actions.add_parser("rate", help="decide it at another rate, for --ttl")
        rate.add_argument("policy", help="a policy in use")
        rate.add_argument("identity")
        rate.add_argument("rate", help="e.g. 10000/h (a concurrency policy: its slots)")
        self._lasting(rate)
        clear = actions.add_parser("clear", help="end its override")
        clear.add_argument("policy", help='a policy name, or "*"')
        clear.add_argument("identity")
        listing = actions.add_parser("list", help="every live override")
        listing.add_argument("--policy", help='only this policy\'s (or "*")')

    @staticmethod
    def _lasting(parser: CommandParser) -> None:
        parser.add_argument("--ttl", required=True, help="how long: e.g. 1h, 30d (required)")
        parser.add_argument("--reason", default="", help="kept beside it, shown in the admin")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        with redis_errors_as_command_errors():
            try:
                if action == "list":
                    self._list(options["policy"])
                    return
                policy = self._policy(options["policy"], known=action != "clear")
                identity = options["identity"]
                if action == "clear":
                    cleared = overrides.clear(policy, identity)
                    self.stdout.write(self.style.SUCCESS("cleared") if cleared
                                      else "no override to clear")
                    return
                by = f"manage.py ({_user()})"
                common = {"ttl": options["ttl"], "reason": options["reason"], "by": by}
                if action == "rate":
                    made = overrides.set_rate(policy, identity, options["rate"], **common)
                elif action == "block":
                    made = overrides.block(policy, identity, **common)
                else:
                    made = overrides.allow(policy, identity, **common)
            except (ValueError, RateError, overrides.OverrideUnavailable) as exc:
                raise CommandError(str(exc)) from None
        self.stdout.write(self.style.SUCCESS(_line(made)))

    def _policy(self, name: str, known: bool) -> Policy | str:
        if name == overrides.EVERY_POLICY:
            return name
        in_use = policies_in_use()
        if name in in_use:
            return in_use[name].policy
        if not known:  # a policy since removed can still have its override cleared
            return name
        raise CommandError(f"no policy named {name!r} is in use "
                           f"(known: {', '.join(in_use) or 'none'})")

    def _list(self, policy: str | None) -> None:
        found = sorted(overrides.scan(policy), key=lambda o: (o.policy, o.identity))
        for override in found:
            self.stdout.write(_line(override))
        if not found:
            self.stdout.write("no live override")


def _line(override: overrides.Override) -> str:
    what = f"{override.kind} {override.rate}" if override.rate else override.kind
    reason = f" - {override.reason}" if override.reason else ""
    return (f"{override.policy} {override.identity!r}: {what} until "
            f"{override.expires_at:%Y-%m-%d %H:%M:%S} UTC{reason}")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name (a container's numeric user)
        return "unknown user"
