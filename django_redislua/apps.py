from __future__ import annotations

from django.apps import AppConfig


class RedisLuaConfig(AppConfig):
    name = "django_redislua"
    label = "django_redislua"
    verbose_name = "Redis Lua"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from django_redislua import checks  # noqa: F401  (registers the system checks)
