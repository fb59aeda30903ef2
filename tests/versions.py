"""What the installed redis-py is expected to change in the suite's assertions: the documented
degradations of older versions (docs/checks.md), and nothing else."""

from __future__ import annotations

from django_redislua import lean
from django_redislua.exchange import ASYNC_CLUSTER_PUBSUB

# Before redis-py 8.0 the asyncio cluster client has no pub/sub: a cluster configuration warns
# (redislua.W004) that asyncio waits poll.
EXPECTED_WARNINGS = frozenset() if ASYNC_CLUSTER_PUBSUB else frozenset({"redislua.W004"})
LEAN = lean.SUPPORTED  # the lean transport runs on redis-py 8.1+ only
