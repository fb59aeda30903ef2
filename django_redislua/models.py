"""The admin's anchor: an unmanaged model with no table, like django-rq's.

It exists so the Django admin lists a "Redis Lua" entry and so the app has ``view`` and
``change`` permissions to grant. Its primary key is the Redis key (or lock name) an admin
action touched, so ``LogEntry`` rows written for resets and force-releases point at it.
"""

from __future__ import annotations

from django.db import models


class RedisLua(models.Model):
    key = models.CharField(primary_key=True, max_length=1024)

    class Meta:
        managed = False
        default_permissions = ("view", "change")
        verbose_name = "Redis Lua"
        verbose_name_plural = "Redis Lua"

    def __str__(self) -> str:
        return self.key
