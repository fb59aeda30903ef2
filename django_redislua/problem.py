"""The RFC 9457 problem-details body of this app's own 429 (``REDISLUA["DENIED_BODY"] =
"problem"``), with the problem type draft-ietf-httpapi-ratelimit-headers-11 defines.

Draft -11 section 5.1 defines the "quota-exceeded" problem type (and 5.3
"abnormal-usage-detected", used here for an identity a live override blocks), whose extension member
``violated-policies`` is "an array of strings, whose value is the names of policies where the
quota was exceeded"; section 10.2.1 registers its URI and its title, "Quota Exceeded", with
429 as the recommended status. The names are those of the ``RateLimit-Policy`` items
(:func:`~django_redislua.headers.policy_label`), so a client can match the two. The body is
built as a dict and serialised by ``json.dumps``: names come from settings, but nothing a
name contains can break the JSON. A denied calendar quota adds when it resets (the end of its
period, in its timezone) to the detail and as the extension member ``quota-resets`` (policy
name -> ISO 8601 time).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

from django.http import HttpResponse

from django_redislua.headers import policy_label, retry_after_seconds
from django_redislua.limiting.calendar import now_us
from django_redislua.limiting.decision import BLOCK, Decision, RateLimited
from django_redislua.limiting.definition import CALENDAR

QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
QUOTA_EXCEEDED_TITLE = "Quota Exceeded"
# Draft -11 section 5.3: "a pattern of requests that suggest unintentional or malicious
# behaviour": what an operator's block (django_redislua.overrides) says of an identity.
ABNORMAL_USAGE = "https://iana.org/assignments/http-problem-types#abnormal-usage-detected"
ABNORMAL_USAGE_TITLE = "Abnormal Usage Detected"
CONTENT_TYPE = "application/problem+json"  # RFC 9457 section 6.1; JSON is UTF-8, no charset


def quota_exceeded(exception: RateLimited) -> dict[str, Any]:
    """The problem-details object for a request ``exception`` denied: quota-exceeded, or
    abnormal-usage-detected when a live override blocked the identity (then the blocking
    policies are the violated ones)."""
    denied = [d for d in exception.decisions if not d.allowed]
    blocked = [d for d in denied if d.override == BLOCK]
    names = list(dict.fromkeys(  # two rules on one policy share a Decision: name it once
        policy_label(d.policy.name) for d in blocked or denied))
    wait = retry_after_seconds(exception.decisions)  # the Retry-After header's number
    if wait is None:
        after = "; no wait will admit this request."  # a zero rate, a cost above capacity
    elif wait:
        after = f"; retry after {wait} seconds."
    else:
        after = "."  # a RateLimited raised without a denied Decision
    resets = _quota_resets(denied)
    if resets:
        after = after[:-1] + "".join(
            f"; the {name} quota resets at {at}" for name, at in resets.items()) + "."
    if blocked:
        return {
            "type": ABNORMAL_USAGE,
            "title": ABNORMAL_USAGE_TITLE,
            "status": 429,
            "detail": f"Requests blocked by {', '.join(names)}{after}",
            "violated-policies": names,
        }
    body: dict[str, Any] = {
        "type": QUOTA_EXCEEDED,
        "title": QUOTA_EXCEEDED_TITLE,
        "status": 429,
        "detail": f"Quota exceeded for {', '.join(names) or 'this request'}{after}",
        "violated-policies": names,
    }
    if resets:
        body["quota-resets"] = resets
    return body


def _quota_resets(denied: list[Decision]) -> dict[str, str]:
    """When each denied calendar quota resets (its period's end), in its own timezone, to the
    second: what a paying customer is told (an extension member, RFC 9457 section 3.2)."""
    resets: dict[str, str] = {}
    now = now_us() / 1_000_000
    for d in denied:
        policy = d.policy
        if policy.algorithm != CALENDAR or math.isinf(d.retry_after) or d.override == BLOCK:
            continue
        at = datetime.fromtimestamp(round(now + d.retry_after), UTC)
        resets[policy_label(policy.name)] = at.astimezone(policy.calendar_zone()).isoformat()
    return resets


def quota_exceeded_response(exception: RateLimited) -> HttpResponse:
    """A 429 whose body is :func:`quota_exceeded` as ``application/problem+json``."""
    return HttpResponse(
        json.dumps(quota_exceeded(exception)) + "\n", status=429, content_type=CONTENT_TYPE
    )
