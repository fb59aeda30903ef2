"""The policies of tests/testapp/login_views.py, apart from the views (no Django imports), so a
settings module can name them (tests/login_settings.py, served by gunicorn)."""

from __future__ import annotations

from typing import Any

RATE = "5/m"
# key kind -> the key spec every layer's endpoint of that kind is limited by
KEY_SPECS = {"post": "post:username", "get": "get:q", "header": "header:x-api-key"}
POLICIES: dict[str, dict[str, Any]] = {
    f"rv-{kind}": {"algorithm": "sliding_log", "rate": RATE, "key": spec}
    for kind, spec in KEY_SPECS.items()
}
POLICIES["rv-post"]["methods"] = ["POST"]  # else redislua.W007: every GET would share #absent
POLICIES["login-user"] = {"algorithm": "sliding_log", "rate": RATE, "key": "post:username",
                          "methods": ["POST"]}
MIDDLEWARE_POLICIES = [{"path": f"/mw/{kind}/", "policy": f"rv-{kind}"} for kind in KEY_SPECS]
MIDDLEWARE_POLICIES.append({"path": "/mw/login/", "policy": "login-user"})
