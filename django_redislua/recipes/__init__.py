"""Atomic building blocks beside limits and locks, each operation one script call, sync and
asyncio (``a``-prefixed twins), keys under ``REDISLUA["KEY_PREFIX"]``. See docs/recipes.md."""

from django_redislua.recipes.base import RecipeUnavailable
from django_redislua.recipes.counter import CappedCounter, Count
from django_redislua.recipes.inventory import Inventory, Taken
from django_redislua.recipes.queue import QueueFull, QueueStats, Task, WorkQueue
from django_redislua.recipes.vcache import Versioned, VersionedCache
from django_redislua.recipes.window import Summary, WindowStats

__all__ = [
    "CappedCounter", "Count", "Inventory", "QueueFull", "QueueStats", "RecipeUnavailable",
    "Summary", "Taken", "Task", "Versioned", "VersionedCache", "WindowStats", "WorkQueue",
]
