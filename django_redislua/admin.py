"""The "Redis Lua" admin page: live rate-limit keys, locks, scripts and servers, read from Redis.

A thin layer over :mod:`django_redislua.limiting.inspect`, :mod:`django_redislua.locks.inspect`
and :mod:`django_redislua.recipes.inspect`.
The unmanaged :class:`~django_redislua.models.RedisLua` model anchors the page and its ``view`` /
``change`` permissions; every page is served through ``get_urls`` wrapped in
``admin_site.admin_view`` (staff only, CSRF-protected). Resets, force-releases and live overrides
(:mod:`django_redislua.overrides`) need ``change``, go through a confirmation page or a form,
are POSTs, and are written to the admin log (an override with its reason).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.http import urlencode

from django_redislua import overrides
from django_redislua.checks import eviction_policy, evicts
from django_redislua.conf import settings
from django_redislua.connection import CLIENT_ERRORS, primary_nodes
from django_redislua.discovery import PolicyInUse, policies_in_use
from django_redislua.keys import DRF_SCOPE_KEY
from django_redislua.limiting import inspect
from django_redislua.limiting.definition import overrides_key
from django_redislua.limiting.policy import Policy
from django_redislua.limiting.rates import RateError
from django_redislua.limiting.registry import get_policy
from django_redislua.locks import inspect as locks_inspect
from django_redislua.locks.keys import keys_for
from django_redislua.models import RedisLua
from django_redislua.recipes import inspect as recipes_inspect

if TYPE_CHECKING:
    ModelAdmin = admin.ModelAdmin[RedisLua]
else:  # ModelAdmin is generic only in django-stubs
    ModelAdmin = admin.ModelAdmin


def duration(seconds: float) -> str:
    """A short readable duration: ``850 ms``, ``4.2 s``, ``42 s``, ``3 min 5 s``, ``2 h 10 min``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes == 0:
        return f"{secs} s"
    if minutes < 60:
        return _pair(minutes, "min", secs, "s")
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return _pair(hours, "h", minutes, "min")
    days, hours = divmod(hours, 24)
    return _pair(days, "d", hours, "h")


def _pair(big: int, big_unit: str, small: int, small_unit: str) -> str:
    return f"{big} {big_unit} {small} {small_unit}" if small else f"{big} {big_unit}"


def relative(seconds: float) -> str:
    """``in 42 s`` / ``3.2 s ago`` for an instant ``seconds`` away from now."""
    if abs(seconds) < 0.001:
        return "now"
    return f"in {duration(seconds)}" if seconds > 0 else f"{duration(-seconds)} ago"


def _readable(value: str, now: float) -> str:
    """A stored value with its instants (alone or ``:``-joined) shown relative to ``now``."""
    parts = value.split(":")
    shown = []
    for part in parts:
        at = inspect.instant(part)
        shown.append(part if at is None else relative(at - now))
    return " · ".join(shown)


def _key_row(state: inspect.KeyState) -> dict[str, Any]:
    limit, remaining = state.limit, state.remaining
    return {
        "state": state,
        "has_quota": limit is not None and remaining is not None,
        "low": None if limit is None else limit / 4,
        "high": None if limit is None else limit / 2,
        "reset": None if state.reset_after is None else (
            "now" if state.reset_after <= 0 else relative(state.reset_after)
        ),
        "ttl": "no expiry" if state.ttl is None else duration(state.ttl),
        "fields": [(name, value, _readable(value, state.server_time))
                   for name, value in state.fields],
    }


def _ttl(seconds: float | None) -> str:
    return "no expiry" if seconds is None else duration(seconds)


def _recipe_row(item: Any) -> dict[str, Any]:
    row = {"item": item, "ttl": _ttl(getattr(item, "ttl", None))}  # a queue never expires
    if isinstance(item, recipes_inspect.CacheEntry):
        row["state"] = (f"fresh for {duration(item.fresh_for)}" if item.fresh
                        else f"stale for {duration(-item.fresh_for)}")
    return row


def _recipe_sections(page: recipes_inspect.RecipePage) -> list[dict[str, Any]]:
    """The page's instances, one section per kind (empty ones left out), TTLs made readable."""
    sections: list[tuple[str, list[Any]]] = [
        ("stock", page.stock), ("queue", page.queues), ("cap", page.counters),
        ("vcache", page.caches), ("wstats", page.windows),
    ]
    return [{"kind": kind, "title": recipes_inspect.KINDS[kind],
             "rows": [_recipe_row(item) for item in items]}
            for kind, items in sections if items]


def _policy_rows(in_use: dict[str, PolicyInUse]) -> list[dict[str, Any]]:
    """Every policy in use (settings, inline on routed views, DRF scopes); broken settings too."""
    rows: list[dict[str, Any]] = []
    names = sorted({*in_use, *settings.POLICIES})
    for name in names:
        entry = in_use.get(name)
        if entry is None:
            try:
                get_policy(name)
            except (KeyError, ValueError) as exc:
                rows.append({"name": name, "error": str(exc)})
            continue
        policy = entry.policy
        rows.append({
            "name": name,
            "source": entry.source,
            "mode": policy.mode,
            "algorithm": policy.algorithm,
            "rate": _rate_shown(policy),
            "limit": policy.limit if not policy.is_dynamic else "per request",
            "timeout": None if policy.timeout is None else duration(policy.timeout),
            "key": _key_shown(policy.key),
        })
    return rows


def _rate_shown(policy: Any) -> str | None:
    """A policy's rate as the policies table shows it: per plan (its own for the others), a
    rate callable's dotted name, or the rate; None for a concurrency policy."""
    if policy.algorithm == "concurrency":
        return None
    if policy.plans is not None:
        plans = ", ".join(f"{plan} {'unlimited' if rate is None else rate}"
                          for plan, rate in policy.plans.items())
        return f"{plans}; else {policy.rate_spec}"
    if policy.is_dynamic:
        return f"{policy.callable_name}(request)"
    return str(policy.rate_spec)


def _key_shown(key: object) -> str:
    """A policy's key as the policies table shows it: a DRF scope's as its identities read
    (``throttle_anon_<ident>``), a callable by its dotted name."""
    if isinstance(key, str):
        if key.startswith(DRF_SCOPE_KEY):
            return f"throttle_{key.removeprefix(DRF_SCOPE_KEY)}_<ident>"
        return key
    if callable(key):
        return f"{getattr(key, '__module__', '?')}.{getattr(key, '__qualname__', '?')}(request)"
    return "user_or_ip" if key is None else ""


@admin.register(RedisLua)
class RedisLuaAdmin(ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: RedisLua | None = None) -> bool:
        return False

    def _name(self, page: str) -> str:
        return f"{self.opts.app_label}_{self.opts.model_name}_{page}"

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.keys_view), name=self._name("changelist")),
            path("locks/", wrap(self.locks_view), name=self._name("locks")),
            path("recipes/", wrap(self.recipes_view), name=self._name("recipes")),
            path("scripts/", wrap(self.scripts_view), name=self._name("scripts")),
            path("reset/", wrap(self.reset_view), name=self._name("reset")),
            path("locks/release/", wrap(self.release_view), name=self._name("release")),
            path("overrides/", wrap(self.overrides_view), name=self._name("overrides")),
            path("overrides/set/", wrap(self.override_set_view), name=self._name("override_set")),
            path("overrides/clear/", wrap(self.override_clear_view),
                 name=self._name("override_clear")),
        ]

    def _url(self, page: str, **query: str) -> str:
        url = reverse(f"{self.admin_site.name}:{self._name(page)}")
        query = {k: v for k, v in query.items() if v}
        return f"{url}?{urlencode(query)}" if query else url

    def _context(self, request: HttpRequest, title: str, tab: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "tab": tab,
            "tabs": [
                ("keys", "Rate-limit keys", self._url("changelist")),
                ("locks", "Locks", self._url("locks")),
                ("recipes", "Recipes", self._url("recipes")),
                ("overrides", "Overrides", self._url("overrides")),
                ("scripts", "Scripts & servers", self._url("scripts")),
            ],
            "can_change": self.has_change_permission(request),
            **extra,
        }

    def _require(self, request: HttpRequest, change: bool) -> None:
        allowed = (self.has_change_permission(request) if change
                   else self.has_view_or_change_permission(request))
        if not allowed:
            raise PermissionDenied

    # -- pages ---------------------------------------------------------------------------------
    def keys_view(self, request: HttpRequest) -> HttpResponse:
        self._require(request, change=False)
        search = request.GET.get("q", "").strip()
        policy = request.GET.get("policy", "").strip() or None
        cursor = request.GET.get("cursor", "")
        page: inspect.KeyPage | None = None
        nodes: list[inspect.NodeStatus] = []
        in_use = policies_in_use()
        known = {name: entry.policy for name, entry in in_use.items()}
        try:
            page = inspect.scan_keys(cursor, search=search, policy=policy, known=known)
            nodes = inspect.server_status()
        except ValueError as exc:
            return HttpResponseBadRequest(str(exc))
        except CLIENT_ERRORS as exc:
            messages.error(request, f"Redis did not answer: {exc}")
        rows = [_key_row(s) for s in page.keys] if page else []
        try:
            marked = overrides.lookup((r["state"].policy_name, r["state"].identity) for r in rows)
        except CLIENT_ERRORS:
            marked = {}
        for row in rows:
            row["override"] = marked.get((row["state"].policy_name, row["state"].identity))
        policy_rows = _policy_rows(in_use)
        return TemplateResponse(request, "admin/django_redislua/redislua/keys.html", self._context(
            request, "Rate-limit keys", "keys",
            page=page,
            rows=rows,
            nodes=nodes,
            policies=policy_rows,
            policy_choices=[(row["name"], row["name"]) for row in policy_rows],
            search=search,
            policy=policy or "",
            cursor=cursor,
            first_url=self._url("changelist", q=search, policy=policy or ""),
            more_url=self._url("changelist", q=search, policy=policy or "", cursor=page.cursor)
            if page and page.cursor else None,
            reset_url=self._url("reset"),
            override_url=self._url("override_set"),
            max_scan_calls=inspect.MAX_SCAN_CALLS,
        ))

    def locks_view(self, request: HttpRequest) -> HttpResponse:
        self._require(request, change=False)
        search = request.GET.get("q", "").strip()
        try:
            cursor = int(request.GET.get("cursor", "0"))
        except ValueError:
            return HttpResponseBadRequest("bad cursor")
        start = cursor
        locks: list[locks_inspect.LockInfo] = []
        calls = 0
        try:
            # The same bound as for keys: at most MAX_SCAN_CALLS SCANs per page.
            while calls < inspect.MAX_SCAN_CALLS and len(locks) < inspect.PAGE_SIZE:
                cursor, found = locks_inspect.scan_locks(
                    cursor, match=search or None, count=inspect.MAX_SCAN_COUNT
                )
                locks += found
                calls += 1
                if cursor == 0:
                    break
        except CLIENT_ERRORS as exc:
            messages.error(request, f"Redis did not answer: {exc}")
            cursor = 0
        rows = [
            {"lock": lock, "ttl": "no expiry" if lock.ttl is None else duration(lock.ttl)}
            for lock in sorted(locks, key=lambda lock: lock.name)
        ]
        return TemplateResponse(request, "admin/django_redislua/redislua/locks.html", self._context(
            request, "Locks", "locks",
            rows=rows, search=search, scan_calls=calls, started=start != 0,
            max_scan_calls=inspect.MAX_SCAN_CALLS,
            first_url=self._url("locks", q=search),
            more_url=self._url("locks", q=search, cursor=str(cursor)) if cursor else None,
            cursor=cursor, release_url=self._url("release"),
        ))

    def recipes_view(self, request: HttpRequest) -> HttpResponse:
        self._require(request, change=False)
        kind = request.GET.get("kind", "").strip()
        cursor = request.GET.get("cursor", "")
        page: recipes_inspect.RecipePage | None = None
        try:
            page = recipes_inspect.scan_recipes(cursor, kind=kind or None)
        except ValueError as exc:
            return HttpResponseBadRequest(str(exc))
        except CLIENT_ERRORS as exc:
            messages.error(request, f"Redis did not answer: {exc}")
        return TemplateResponse(request, "admin/django_redislua/redislua/recipes.html",
                                self._context(
            request, "Recipes", "recipes",
            page=page, sections=_recipe_sections(page) if page else [], kind=kind,
            kinds=list(recipes_inspect.KINDS.items()), cursor=cursor,
            max_scan_calls=inspect.MAX_SCAN_CALLS, first_url=self._url("recipes", kind=kind),
            more_url=self._url("recipes", kind=kind, cursor=page.cursor)
            if page and page.cursor else None,
        ))

    def scripts_view(self, request: HttpRequest) -> HttpResponse:
        self._require(request, change=False)
        from django_redislua.scripts import registry

        nodes: list[inspect.NodeStatus] = []
        evictions: dict[str, str | None] = {}
        try:
            nodes = inspect.server_status()
            evictions = {name: eviction_policy(node) for name, node in primary_nodes()}
        except CLIENT_ERRORS as exc:
            messages.error(request, f"Redis did not answer: {exc}")
        servers = [{"node": node, "eviction": evictions.get(node.name),
                    "evicts": evicts(evictions.get(node.name))} for node in nodes]
        scripts = [
            # Plain values: the template engine would call a Script (it is callable).
            {"name": name, "sha": script.sha,
             "loaded": [node.scripts.get(name, False) for node in nodes]}
            for name, script in sorted(registry.all().items())
        ]
        return TemplateResponse(request, "admin/django_redislua/redislua/scripts.html",
                                self._context(request, "Scripts & servers", "scripts",
                                              nodes=nodes, servers=servers, scripts=scripts,
                                              library=registry.library()[0]))

    # -- actions: GET = confirmation page, POST = do it ----------------------------------------
    def reset_view(self, request: HttpRequest) -> HttpResponse:
        self._require(request, change=True)
        data = request.POST if request.method == "POST" else request.GET
        key = data.get("key", "")
        parts = inspect.parse_key(key)
        if parts is None:
            return HttpResponseBadRequest("not a rate-limit key of this app")
        back = data.get("next", "")
        if not back.startswith(self._url("changelist")):
            back = self._url("changelist")
        if request.method != "POST":
            state = None
            try:
                known = {name: e.policy for name, e in policies_in_use().items()}
                page = inspect.scan_keys(search=key, known=known)
                state = page.keys[0] if page.keys else None
            except CLIENT_ERRORS as exc:
                messages.error(request, f"Redis did not answer: {exc}")
            return TemplateResponse(
                request, "admin/django_redislua/redislua/confirm.html",
                self._context(
                    request, "Reset a rate-limit key?", "keys", action="reset", target=key,
                    row=_key_row(state) if state else None, policy_name=parts[0],
                    identity=parts[2], back=back, action_url=self._url("reset"),
                ),
            )
        try:
            deleted = inspect.reset_key(key)
        except CLIENT_ERRORS as exc:
            messages.error(request, f"Redis did not answer: {exc}; {key} was not reset.")
            return HttpResponseRedirect(back)
        if deleted:
            self.log_change(request, RedisLua(key=key),
                            f"Reset rate-limit key {key} (policy {parts[0]}, identity {parts[2]}).")
            messages.success(request, f"Reset {key}: the next request starts from a full quota.")
        else:
            messages.warning(request, f"{key} was already gone (expired or reset).")
        return HttpResponseRedirect(back)

    def release_view(self, request: HttpRequest) -> HttpResponse:
        self._require(request, change=True)
        data = request.POST if request.method == "POST" else request.GET
        name = data.get("name", "")
        if not name:
            return HttpResponseBadRequest("which lock?")
        back = data.get("next", "")
        if not back.startswith(self._url("locks")):
            back = self._url("locks")
        if request.method != "POST":
            held = None
            try:
                held = locks_inspect.get_lock(name)
            except CLIENT_ERRORS as exc:
                messages.error(request, f"Redis did not answer: {exc}")
            return TemplateResponse(
                request, "admin/django_redislua/redislua/confirm.html",
                self._context(request, "Force-release a lock?", "locks", action="release",
                              target=name, held=held, back=back, action_url=self._url("release")),
            )
        try:
            released = locks_inspect.force_release(name)
        except CLIENT_ERRORS as exc:
            messages.error(request, f"Redis did not answer: {exc}; lock {name} was not released.")
            return HttpResponseRedirect(back)
        if released:
            self.log_change(request, RedisLua(key=keys_for("lock", name).base),
                            f"Force-released lock {name}.")
            messages.success(request, f"Released lock {name}; its waiters were woken.")
        else:
            messages.warning(request, f"Lock {name} was not held (released or expired).")
        return HttpResponseRedirect(back)

    # -- live overrides ----------------------------------------------------------------------
    def overrides_view(self, request: HttpRequest) -> HttpResponse:
        self._require(request, change=False)
        search = request.GET.get("q", "").strip()
        policy = request.GET.get("policy", "").strip() or None
        found: list[overrides.Override] = []
        try:
            for override in overrides.scan(policy):
                if search in override.identity:
                    found.append(override)
                if len(found) > MAX_LISTED:
                    break
        except CLIENT_ERRORS as exc:
            messages.error(request, f"Redis did not answer: {exc}")
        found.sort(key=lambda o: (o.policy, o.identity))
        now = time.time()
        rows = [{"override": o, "until": relative(o.expires_at.timestamp() - now),
                 "clear_url": self._url("override_clear", policy=o.policy, tag=o.tag)}
                for o in found[:MAX_LISTED]]
        return TemplateResponse(request, "admin/django_redislua/redislua/overrides.html",
                                self._context(
            request, "Live overrides", "overrides", rows=rows, more=len(found) > MAX_LISTED,
            search=search, policy=policy or "",
            policy_choices=[(name, "* (every policy)" if name == overrides.EVERY_POLICY else name)
                            for name in _override_policies()],
            add_url=self._url("override_set", next=request.get_full_path())
            if self.has_change_permission(request) else None,
        ))

    def override_set_view(self, request: HttpRequest) -> HttpResponse:
        """GET: the form (prefilled from the query, e.g. the keys tab's "Block 1 h"); POST: set
        it, log it with its reason, and go back."""
        self._require(request, change=True)
        data = request.POST if request.method == "POST" else request.GET
        back = self._back(data.get("next", ""), "overrides")
        form = {name: data.get(name, "").strip()[:MAX_FIELD]
                for name in ("policy", "identity", "tag", "kind", "rate", "ttl", "reason")}
        form["kind"] = form["kind"] or overrides.BLOCK
        form["ttl"] = form["ttl"] or "1h"
        error = ""
        if request.method == "POST":
            try:
                made = self._set_override(request, form)
            except (ValueError, RateError, KeyError) as exc:
                error = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
            except OVERRIDE_FAILURES as exc:
                error = f"Redis did not answer: {exc}; nothing was set."
            else:
                what = made.kind if made.rate is None else f"rate {made.rate}"
                messages.success(request, f"{what.capitalize()} for {made.identity} under "
                                          f"{made.policy} until {made.expires_at:%Y-%m-%d %H:%M} "
                                          "UTC, on every app server from its next decision.")
                return HttpResponseRedirect(back)
        return TemplateResponse(
            request, "admin/django_redislua/redislua/override_form.html",
            self._context(request, "Set a live override", "overrides", form=form, error=error,
                          policies=_override_policies(), back=back,
                          kinds=[(overrides.BLOCK, "Block: refuse it, consuming nothing"),
                                 (overrides.ALLOW, "Allow: admit it, consuming nothing"),
                                 (overrides.RATE, "Rate: decide it at another rate")],
                          action_url=self._url("override_set")),
            status=400 if error else 200,
        )

    def _set_override(self, request: HttpRequest, form: dict[str, str]) -> overrides.Override:
        target = _override_policy(form["policy"])
        identity: str = overrides.Tag(form["tag"]) if form["tag"] else form["identity"]
        if not identity:
            raise ValueError("Which identity? Give the one the policy's key function yields.")
        by = request.user.get_username()
        common: dict[str, Any] = {"ttl": form["ttl"], "reason": form["reason"], "by": by}
        if form["kind"] == overrides.RATE:
            made = overrides.set_rate(target, identity, form["rate"], **common)
        elif form["kind"] == overrides.ALLOW:
            made = overrides.allow(target, identity, **common)
        elif form["kind"] == overrides.BLOCK:
            made = overrides.block(target, identity, **common)
        else:
            raise ValueError(f"Block, allow or rate, not {form['kind']!r}.")
        what = made.kind if made.rate is None else f"rate {made.rate}"
        self.log_change(request, RedisLua(key=overrides_key(made.tag)),
                        f"Override {what} of identity {made.identity} under policy {made.policy}"
                        f" until {made.expires_at:%Y-%m-%d %H:%M:%S} UTC. Reason: "
                        f"{made.reason or '(none given)'}")
        return made

    def override_clear_view(self, request: HttpRequest) -> HttpResponse:
        self._require(request, change=True)
        data = request.POST if request.method == "POST" else request.GET
        policy, tag = data.get("policy", "")[:MAX_FIELD], data.get("tag", "")[:MAX_FIELD]
        try:
            tag = overrides.Tag(tag)
        except ValueError:
            tag = ""
        if not policy or not tag:
            return HttpResponseBadRequest("which override?")
        back = self._back(data.get("next", ""), "overrides")
        try:
            target: Policy | str = _override_policy(policy)
        except KeyError:
            target = policy  # a policy no longer in use: its override can still be cleared
        if request.method != "POST":
            current = None
            try:
                current = overrides.get(target, tag)
            except OVERRIDE_FAILURES as exc:
                messages.error(request, f"Redis did not answer: {exc}")
            return TemplateResponse(
                request, "admin/django_redislua/redislua/confirm.html",
                self._context(request, "Clear a live override?", "overrides",
                              action="clear_override", target=tag, policy_name=policy,
                              override=current, back=back,
                              action_url=self._url("override_clear")),
            )
        try:
            cleared = overrides.clear(target, tag)
        except OVERRIDE_FAILURES as exc:
            messages.error(request, f"Redis did not answer: {exc}; the override was not cleared.")
            return HttpResponseRedirect(back)
        if cleared:
            self.log_change(request, RedisLua(key=overrides_key(tag)),
                            f"Cleared the override of identity {tag} under policy {policy}.")
            messages.success(request, f"Cleared the override of {tag} under {policy}: its "
                                      "policy decides again from the next request.")
        else:
            messages.warning(request, f"{tag} had no override under {policy} (ended or cleared).")
        return HttpResponseRedirect(back)

    def _back(self, wanted: str, page: str) -> str:
        """Where to go after an action: ``wanted`` if it is one of these pages, else ``page``."""
        mine = self._url("changelist")
        return wanted if wanted.startswith(mine) else self._url(page)


MAX_LISTED = 500  # overrides listed on one page (the list says when there are more)
# Redis failing under an override call: the API's own error, or the client's (a scan).
OVERRIDE_FAILURES: tuple[type[BaseException], ...] = (overrides.OverrideUnavailable,
                                                      *CLIENT_ERRORS)
MAX_FIELD = 1000  # characters read of a form field (the API bounds them further)


def _override_policies() -> list[str]:
    return [overrides.EVERY_POLICY, *sorted(policies_in_use())]


def _override_policy(name: str) -> Policy | str:
    """A policy in use (settings, routed views, DRF scopes), or "*"; KeyError otherwise."""
    if name == overrides.EVERY_POLICY:
        return name
    in_use = policies_in_use()
    if name not in in_use:
        raise KeyError(f"No policy named {name[:60]!r} is in use "
                       f"(known: {', '.join(sorted(in_use)) or 'none'}).")
    return in_use[name].policy
