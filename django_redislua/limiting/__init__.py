"""The rate-limit engine: policies decided in Redis by one script call. Knows no requests."""

from django_redislua.limiting.decision import Decision, PolicyError, RateLimited
from django_redislua.limiting.engine import aevaluate, evaluate
from django_redislua.limiting.policy import Policy
from django_redislua.limiting.rates import Rate, parse_duration, parse_rate
from django_redislua.limiting.registry import get_policy

__all__ = [
    "Decision",
    "Policy",
    "PolicyError",
    "Rate",
    "RateLimited",
    "aevaluate",
    "evaluate",
    "get_policy",
    "parse_duration",
    "parse_rate",
]
