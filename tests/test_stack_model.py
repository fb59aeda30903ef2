"""Random stacks of @ratelimit through the real decorator against a pure-Python model.

A stack is 1-4 rules: blocking or soft (``block=False``), mixed algorithms, costs, method
filters, and identities that repeat (rules sharing a ``group=``, keys that coincide). Each
request's status, ``request.limited`` and every policy's remaining quota must be what the model
says. Rates are per 30 days, so no quota refills and no window turns while an example runs:
the model is pure counting, which is exactly what the engine's gate semantics are about.

The model: the rules that apply (method filter) are merged by state key (policy name and
identity): the strictest limit, the largest cost, gating if any merged rule blocks. A request is
denied (429) when a gating rule is over its limit; then no gating rule consumes. A soft rule
consumes whenever it allows, and its denial only marks the request.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from django_redislua.connection import get_client
from django_redislua.decorators import ratelimit
from django_redislua.limiting import denials

ALGORITHMS = ["fixed_window", "sliding_log", "sliding_window", "token_bucket", "leaky_bucket",
              "gcra"]
SETTINGS = settings(
    max_examples=int(os.environ.get("REDISLUA_PROPERTY_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
factory = RequestFactory()


@dataclass(frozen=True)
class RuleSpec:
    group: str
    count: int
    algorithm: str
    block: bool
    cost: int
    methods: tuple[str, ...] | None
    key: str


rule_specs = st.builds(
    RuleSpec,
    group=st.sampled_from(["g1", "g2", "g3"]),  # few groups: rules share state on purpose
    count=st.integers(0, 5),
    algorithm=st.sampled_from(ALGORITHMS),
    block=st.booleans(),
    cost=st.integers(1, 3),
    methods=st.none() | st.sampled_from([("GET",), ("POST",), ("GET", "POST")]),
    key=st.sampled_from(["ip", "header:x-user", "get:u"]),
)
requests = st.lists(
    st.tuples(st.sampled_from(["GET", "POST"]), st.sampled_from(["a", "b"])),
    min_size=1, max_size=8,
)


def build_view(rules: list[RuleSpec]) -> Any:
    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    for rule in reversed(rules):  # the first rule is the outermost decorator
        view = ratelimit(
            rate=f"{rule.count}/30d", algorithm=rule.algorithm, block=rule.block,
            cost=rule.cost, methods=list(rule.methods) if rule.methods else None, key=rule.key,
            group=f"{rule.group}-{rule.algorithm}",
        )(view)
    return view


def identity(rule: RuleSpec, who: str) -> str:
    # ip: every request comes from one address; the others follow the drawn user.
    return "127.0.0.1" if rule.key == "ip" else who


def broken(rule: RuleSpec) -> bool:
    """A cost above a non-zero count is a configuration mistake (redislua.E010): under FAIL_OPEN
    the rule is skipped, never a 500."""
    return 0 < rule.count < rule.cost


class Model:
    def __init__(self) -> None:
        self.used: dict[tuple[str, str], int] = {}

    def request(self, rules: list[RuleSpec], method: str, who: str) -> tuple[int, bool, bool]:
        """(status, request.limited, whether a 429 carries Retry-After)."""
        merged: dict[tuple[str, str], list[int]] = {}  # state -> [limit, cost, gating]
        for rule in rules:
            if broken(rule) or (rule.methods is not None and method not in rule.methods):
                continue
            state = (f"{rule.group}-{rule.algorithm}", identity(rule, who))
            if state not in merged:
                merged[state] = [rule.count, rule.cost, int(rule.block)]
            else:
                limit, cost, gating = merged[state]
                merged[state] = [min(limit, rule.count), max(cost, rule.cost),
                                 int(gating or rule.block)]
        allowed = {
            state: self.used.get(state, 0) + cost <= limit
            for state, (limit, cost, _gating) in merged.items()
        }
        gates = all(allowed[s] for s, (_l, _c, gating) in merged.items() if gating)
        for state, (_limit, cost, gating) in merged.items():
            if allowed[state] and (gates or not gating):
                self.used[state] = self.used.get(state, 0) + cost
        # Retry-After is left out when some denial can never be lifted by waiting.
        hopeless = any(
            not allowed[s] and cost > limit for s, (limit, cost, _g) in merged.items()
        )
        return (200 if gates else 429), not all(allowed.values()), not gates and not hopeless


@pytest.fixture(autouse=True)
def _one_rule_name_per_group() -> Any:
    with override_settings(REDISLUA={"CONNECTION": get_client_url(), "HEADERS": "ietf"}):
        yield


def get_client_url() -> str:
    from django.conf import settings as django_settings

    return str(django_settings.REDIS_URL)


@SETTINGS
@given(rules=st.lists(rule_specs, min_size=1, max_size=4), sequence=requests)
def test_random_stacks_match_the_model(rules: list[RuleSpec], sequence: list[Any]) -> None:
    # The model counts units used. A leaky bucket's and GCRA's state is time (water, a
    # theoretical arrival time), which a rule reads at its own rate: rules of different rates
    # sharing one of them disagree on how many units that time is, by design (ratelimit.md).
    assume(not any(
        r.algorithm in ("leaky_bucket", "gcra") and (r.group, r.algorithm) == (o.group, o.algorithm)
        and r.count != o.count and not broken(r) and not broken(o)
        for r in rules for o in rules
    ))
    client = get_client()
    assert isinstance(client, redis.Redis)
    client.flushall()
    denials.forget()  # this process's denials of the keys just flushed
    view = build_view(rules)
    model = Model()
    for method, who in sequence:
        request = getattr(factory, method.lower())(
            "/?u=" + who, HTTP_X_USER=who, REMOTE_ADDR="127.0.0.1"
        )
        response = view(request)
        status, limited, retry_after = model.request(rules, method, who)
        assert response.status_code == status, (rules, sequence, model.used)
        assert bool(getattr(request, "limited", False)) == limited
        assert response.has_header("Retry-After") == retry_after
    # Every policy's state: what remains is its limit minus what the model counted. (A state
    # shared by rules of different counts is left out: its remaining depends on who peeks.)
    for rule in rules:
        sharing = {r.count for r in rules if (r.group, r.algorithm) == (rule.group, rule.algorithm)
                   and not broken(r)}
        if broken(rule) or len(sharing) > 1 or rule.count == 0:
            continue
        for who in ("a", "b"):
            used = model.used.get((f"{rule.group}-{rule.algorithm}", identity(rule, who)), 0)
            assert peek_remaining(rule, who) == rule.count - used, (rule, who, used)


def peek_remaining(rule: RuleSpec, who: str) -> int:
    from django_redislua import Policy

    policy = Policy(f"{rule.group}-{rule.algorithm}", rate=f"{rule.count}/30d",
                    algorithm=rule.algorithm)
    return policy.peek(identity(rule, who)).remaining
