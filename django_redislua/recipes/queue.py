"""``WorkQueue``: a bounded work queue whose claimed tasks come back when their worker dies.

The classic races: ``LPOP`` then record "in progress" (a crash between the two loses the task);
two workers both requeue an expired task (it runs twice). Here a claim moves the task to the
in-flight set in the same script that pops it, every claim first returns expired claims to the
queue, and only the claim that holds a task (its token) can ack, release or extend it.

Delivery is at least once: a task whose worker died runs again after ``visibility_timeout``.
A worker that may take longer than that must :meth:`WorkQueue.extend` its claim, or a second
worker gets the task while the first still runs.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any, NamedTuple

from django_redislua.recipes.base import (
    Op,
    arun,
    delete_op,
    key,
    milliseconds,
    recipe_name,
    run,
    whole,
)
from django_redislua.replies import text


class QueueFull(Exception):
    """``put`` found the queue holding ``max_length`` tasks: nothing was added."""


@dataclass(frozen=True)
class Task:
    """A claimed task: ``payload`` (what was put), ``attempts`` (this claim included) and the
    claim's ``deadline`` on the Redis server's clock (Unix time, seconds)."""

    id: str
    payload: Any
    token: str
    attempts: int
    deadline: float


class QueueStats(NamedTuple):
    """``pending``: waiting to be claimed; ``in_flight``: claimed, of which ``expired`` are past
    their deadline (they return with the next claim); ``dead``: used up ``max_attempts``."""

    pending: int
    in_flight: int
    expired: int
    dead: int


class WorkQueue:
    """A queue called ``name``: at most ``max_in_flight`` tasks claimed at once, each claim
    lasting ``visibility_timeout`` unless acked, released or extended; with ``max_length``
    ``put`` refuses past that many tasks (pending and in flight); with ``max_attempts`` a task
    claimed that many times without an ack goes to the dead tasks instead of running again.

    Payloads are JSON (they cross processes and services: nothing is unpickled). The queue's
    keys never expire: a task is kept until it is acked.
    """

    kind = "queue"

    def __init__(self, name: str, max_in_flight: int = 10, visibility_timeout: float | str = "5m",
                 max_length: int | None = None, max_attempts: int | None = None) -> None:
        self.name = recipe_name(name)
        self.max_in_flight = whole(max_in_flight, "max_in_flight", 1)
        self.visibility_ms = milliseconds(visibility_timeout)
        self.max_length = "" if max_length is None else whole(max_length, "max_length", 1)
        self.max_attempts = "" if max_attempts is None else whole(max_attempts, "max_attempts", 1)
        base = key(self.kind, self.name)
        self.keys = [base, *(f"{base}:{part}" for part in (
            "tasks", "in_flight", "claims", "attempts", "dead", "sequence"))]

    def __repr__(self) -> str:
        return f"<WorkQueue {self.name}>"

    def _put(self, payload: Any) -> Op[str]:
        blob = json.dumps(payload, separators=(",", ":"))

        def read(reply: Any) -> str:
            if int(reply) == 0:
                raise QueueFull(f"queue {self.name!r} holds {self.max_length} tasks")
            return text(reply)

        return Op("django_redislua.recipe_queue_put", self.keys, [blob, self.max_length], read)

    def put(self, payload: Any) -> str:
        """Append a task (any JSON-serialisable value); returns its id. Raises
        :class:`QueueFull` at ``max_length``, TypeError for a payload JSON cannot write."""
        return run(self._put(payload))

    async def aput(self, payload: Any) -> str:
        return await arun(self._put(payload))

    def _claim(self) -> Op[Task | None]:
        token = secrets.token_hex(16)

        def read(reply: Any) -> Task | None:
            if len(reply) < 4:  # nothing pending, or max_in_flight claimed
                return None
            task_id, payload, attempts, deadline = reply
            return Task(text(task_id), json.loads(payload), token, int(attempts),
                        int(deadline) / 1000)

        return Op("django_redislua.recipe_queue_claim", self.keys,
                  [token, self.visibility_ms, self.max_in_flight, self.max_attempts], read)

    def claim(self) -> Task | None:
        """The next task, claimed for ``visibility_timeout``; None when nothing is pending or
        ``max_in_flight`` tasks are claimed. Expired claims return to the queue first."""
        return run(self._claim())

    async def aclaim(self) -> Task | None:
        return await arun(self._claim())

    def _finish(self, action: str, task: Task, arg: str | int) -> Op[int]:
        return Op("django_redislua.recipe_queue_finish", self.keys,
                  [action, task.id, task.token, arg], int)

    def ack(self, task: Task) -> bool:
        """The task is done: forget it. False when the claim had expired and the task went
        back to the queue (it will run again; make tasks idempotent)."""
        return bool(run(self._finish("ack", task, "")))

    async def aack(self, task: Task) -> bool:
        done: int = await arun(self._finish("ack", task, ""))
        return bool(done)

    def release(self, task: Task) -> bool:
        """Give the task back now (to the end of the queue, or to the dead tasks when it used up
        ``max_attempts``). False when the claim no longer held it."""
        return bool(run(self._finish("release", task, self.max_attempts)))

    async def arelease(self, task: Task) -> bool:
        done: int = await arun(self._finish("release", task, self.max_attempts))
        return bool(done)

    def _extend(self, task: Task) -> Op[float | None]:
        return Op("django_redislua.recipe_queue_finish", self.keys,
                  ["extend", task.id, task.token, self.visibility_ms],
                  lambda deadline: int(deadline) / 1000 if int(deadline) else None)

    def extend(self, task: Task) -> float | None:
        """Make the claim last ``visibility_timeout`` from now; the new deadline (server clock,
        seconds), or None when the claim no longer held the task (stop working on it)."""
        return run(self._extend(task))

    async def aextend(self, task: Task) -> float | None:
        return await arun(self._extend(task))

    def _stats(self) -> Op[QueueStats]:
        return Op("django_redislua.recipe_queue_stats", self.keys, [],
                  lambda reply: QueueStats(*(int(n) for n in reply)))

    def stats(self) -> QueueStats:
        return run(self._stats())

    async def astats(self) -> QueueStats:
        return await arun(self._stats())

    def clear(self) -> bool:
        """Delete the queue: every task, pending, in flight and dead. True if it existed."""
        return run(delete_op(self.keys))

    async def aclear(self) -> bool:
        return await arun(delete_op(self.keys))
