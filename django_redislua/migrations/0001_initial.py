# The admin's anchor model is unmanaged: this migration records it and creates no table.
from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    operations = [
        migrations.CreateModel(
            name="RedisLua",
            fields=[
                ("key", models.CharField(max_length=1024, primary_key=True, serialize=False)),
            ],
            options={
                "verbose_name": "Redis Lua",
                "verbose_name_plural": "Redis Lua",
                "managed": False,
                "default_permissions": ("view", "change"),
            },
        ),
    ]
