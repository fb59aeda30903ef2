"""``manage.py redislua_status``: connection, server, policies, scripts per node, key counts."""

from __future__ import annotations

from typing import Any

import redis
from django.core.management.base import BaseCommand, CommandParser

from django_redislua.conf import settings
from django_redislua.connection import primary_nodes
from django_redislua.endpoints import resolve_endpoint
from django_redislua.functions import load_scripts, server_version
from django_redislua.limiting import PolicyError, get_policy
from django_redislua.management import redis_errors_as_command_errors

SCAN_BUDGET = 100_000  # keys examined per node at most, so a huge Redis still answers quickly


class Command(BaseCommand):
    help = "Show the Redis connection, server version, policies, scripts per node and key counts."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-keys", action="store_true", help="skip counting keys (no SCAN)")

    def handle(self, *args: Any, **options: Any) -> None:
        with redis_errors_as_command_errors():
            endpoint = resolve_endpoint()
            source = f"cache {endpoint.cache_alias!r}" if endpoint.cache_alias else "URL"
            self.stdout.write(f"connection: {endpoint.kind} via {source}")
            nodes = primary_nodes()
            for node, client in nodes:
                version = ".".join(map(str, server_version(client)))
                memory = client.info("memory").get("used_memory_human", "?")
                self.stdout.write(f"node {node}: Redis {version}, used memory {memory}")
            self.stdout.write("policies:")
            for name in settings.POLICIES:
                try:
                    policy = get_policy(name)
                except PolicyError as exc:
                    self.stdout.write(self.style.ERROR(f"  {name}: {exc} ({exc.check_id})"))
                    continue
                what = policy.rate if policy.rate else policy.rate_spec
                if policy.algorithm == "concurrency":
                    what = f"{policy.limit} slots, lease {policy.timeout}s"
                self.stdout.write(f"  {name}: {policy.algorithm} {what}")
            self.stdout.write("scripts:")
            for row in load_scripts(check_only=True):
                style = self.style.SUCCESS if row.status == "present" else self.style.WARNING
                self.stdout.write(f"  {row.node}  {row.name}  {row.sha[:12]}  {style(row.status)}")
            if not options["no_keys"]:
                self.stdout.write("keys:")
                for node, client in nodes:
                    self.stdout.write(f"  {node}: {self._count(client)}")

    def _count(self, client: redis.Redis) -> str:
        count = examined = 0
        cursor = 0
        pattern = f"{settings.KEY_PREFIX}:*"
        while True:
            cursor, keys = client.scan(cursor, match=pattern, count=1000)
            count += len(keys)
            examined += 1000
            if cursor == 0:
                return f"{count} keys under {pattern}"
            if examined >= SCAN_BUDGET:
                return (
                    f"at least {count} keys under {pattern} (stopped after {SCAN_BUDGET} examined)"
                )
