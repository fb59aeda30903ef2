"""Request -> identity: the part of a request a policy counts by.

Key specs: ``"ip"``, ``"user"``, ``"user_or_ip"``, ``"header:<name>"``, ``"get:<param>"``,
``"post:<param>"``, a callable ``(request) -> str | None`` or its dotted path. ``None`` from a
key callable means "not limited" (and from ``user``, an anonymous request); a request that lacks
the value a ``get:``/``post:``/``header:`` key reads is limited under the one shared identity
:data:`~django_redislua.limiting.identity.ABSENT`, never skipped. ``post:<param>`` reads the
field wherever the request carries it: a form, DRF's parsed ``request.data``, a JSON object
body (bounded: see :func:`body_field`). Values are bounded before they reach a Redis key (see
:func:`django_redislua.limiting.identity.bound_identity`).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any, cast

from django.conf import settings as django_settings
from django.http import HttpRequest

from django_redislua import conf
from django_redislua.conf import settings
from django_redislua.limiting.decision import PolicyError
from django_redislua.limiting.identity import ABSENT, ABSENT_TEXT
from django_redislua.limiting.options import resolve_callable
from django_redislua.replies import text as as_text
from django_redislua.reporting import report_unknown_address

KeyFunc = Callable[[HttpRequest], "str | None"]
NAMED_KEYS = ("ip", "user", "user_or_ip")
PARAM_KEYS = ("header", "get", "post")
DEFAULT_KEY = "user_or_ip"


def _parse_address(raw: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An address from ``1.2.3.4``, ``1.2.3.4:567``, ``::1``, ``[::1]:567`` or ``fe80::1%eth0``."""
    raw = raw.strip()
    if not raw or len(raw) > 64:
        return None
    if raw.startswith("["):  # [v6] or [v6]:port
        raw = raw[1:].partition("]")[0]
    elif raw.count(":") == 1:  # v4:port
        raw = raw.partition(":")[0]
    raw = raw.partition("%")[0]  # an IPv6 zone names an interface of ours, not the client
    try:
        address = ipaddress.ip_address(raw)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


# The identity of every request whose address cannot be determined (no REMOTE_ADDR, as behind a
# unix-socket proxy that does not set it, or a malformed one): they share one quota, so a broken
# or hostile address is limited together with its like, never unlimited.
UNKNOWN_ADDRESS = "unknown-address"


# Addresses up to this long are remembered once masked (_masked_by, the 4,096 last used): a
# server sees the same clients again and again, and parsing and masking an address took about a
# tenth of the request layer's CPU. Longer values (an address is at most 64 characters once
# stripped: _parse_address) are read each time, so junk cannot crowd the cache with big entries.
REMEMBERED_ADDRESS_TEXT = 128


def masked(raw: str) -> str | None:
    """``raw`` as a key: the address masked to its network (``IPV4_MASK``/``IPV6_MASK``), or
    None when it is not an address."""
    masking = _masked_by if len(raw) <= REMEMBERED_ADDRESS_TEXT else _masked_by.__wrapped__
    return masking(raw, conf.generation)


@functools.lru_cache(maxsize=4096)
def _masked_by(raw: str, generation: int) -> str | None:
    """Masked under the settings of ``generation`` (read before the masks: a change while
    masking makes the entry stale, never wrong for the new masks)."""
    address = _parse_address(raw)
    if address is None:
        return None
    if isinstance(address, ipaddress.IPv4Address):
        prefix = settings.IPV4_MASK
    else:
        prefix = settings.IPV6_MASK
    if prefix >= address.max_prefixlen:
        return str(address)
    return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))


def forwarded_address(forwarded: str, proxies: int) -> str | None:
    """The entry ``proxies`` places from the right of an X-Forwarded-For value, or None when
    there are fewer entries than that.

    Split from the right and only that far (``rsplit`` with a bound): whatever the client put
    to the left, however long, is never read, so it cannot push the proxies' entries out.
    """
    hops = forwarded.rsplit(",", proxies)
    if len(hops) < proxies:
        return None
    return hops[-proxies]


def client_ip(request: HttpRequest) -> str | None:
    """The client's address, masked to its network (``IPV4_MASK``/``IPV6_MASK``), or None.

    With ``TRUSTED_PROXIES = N`` the address is the Nth entry from the right of
    ``X-Forwarded-For`` (each trusted proxy appends the peer it saw); entries to the left of it
    are client-supplied and never trusted. With fewer than N entries the request did not come
    through the proxies, so ``REMOTE_ADDR`` (the real peer) is used. A missing or malformed
    address gives None (the ``ip`` key then uses :data:`UNKNOWN_ADDRESS`).
    """
    proxies = settings.TRUSTED_PROXIES
    raw = request.META.get("REMOTE_ADDR")
    if proxies > 0:
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR")
        if isinstance(forwarded, str):
            hop = forwarded_address(forwarded, proxies)
            if hop is not None:
                raw = hop
    if not isinstance(raw, str):
        return None
    return masked(raw)


def _ip(request: HttpRequest) -> str:
    address = client_ip(request)
    if address is None:
        _report_unknown(request)
        return UNKNOWN_ADDRESS
    return address


def _report_unknown(request: HttpRequest) -> None:
    report_unknown_address(request)


def _user(request: HttpRequest) -> str | None:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    return f"u{user.pk}"


def _user_or_ip(request: HttpRequest) -> str | None:
    return _user(request) or _ip(request)


def _header(name: str) -> KeyFunc:
    meta = "HTTP_" + name.upper().replace("-", "_")
    if name.lower().replace("_", "-") == "content-type":
        meta = "CONTENT_TYPE"

    def key(request: HttpRequest) -> str:
        return request.META.get(meta) or ABSENT

    return key


# A JSON body is parsed for a post:<param> key only up to this size (when Django's
# DATA_UPLOAD_MAX_MEMORY_SIZE is None; else up to that): a larger one is not read at all and
# its request counts as one that lacks the field (limited under ABSENT), so a huge body costs a
# decision no work. Django refuses to read bodies above DATA_UPLOAD_MAX_MEMORY_SIZE anyway.
JSON_BODY_LIMIT = 2_621_440
_JSON_TYPES = ("application/json",)


def _is_json(content_type: str) -> bool:
    return content_type in _JSON_TYPES or (
        content_type.startswith("application/") and content_type.endswith("+json"))


def field_text(value: object) -> str | None:
    """A body field's value as an identity: text as it is; a number or a boolean as JSON
    writes it (``42`` and ``"42"`` are one identity); a list or an object as its canonical
    JSON (bounded later like any value); None for null or an empty string."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape") or None
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return str(value)


def body_field(request: HttpRequest, name: str) -> str | None:
    """The field ``name`` of ``request``'s body, wherever it carries it, or None.

    - DRF's ``Request`` (a throttle, or a key read inside an API view): DRF's parsed
      ``request.data``, so every parser the view accepts (JSON, form, multipart). A body DRF
      cannot parse raises DRF's own ParseError (its 400), as the view would; one nested too
      deep for its JSON parser (a RecursionError, which DRF would answer 500) has no field.
    - A form (urlencoded or multipart): ``request.POST`` (Django's limits apply).
    - A JSON body (``application/json``, ``application/*+json``): parsed when its declared
      length is at most ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (:data:`JSON_BODY_LIMIT` when that is
      None); a body that is larger, not UTF-8, not JSON, too deeply nested or not an object
      has no field.
    """
    if not isinstance(request, HttpRequest):  # DRF's Request wraps one; it is not one
        try:
            data = request.data
        except RecursionError:  # DRF's JSONParser lets it out (a 500); its data is then empty
            return None
        return field_text(data.get(name)) if isinstance(data, Mapping) else None
    content_type = request.content_type or ""
    if not _is_json(content_type):
        return field_text(request.POST.get(name))
    limit = getattr(django_settings, "DATA_UPLOAD_MAX_MEMORY_SIZE", None) or JSON_BODY_LIMIT
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return None
    if length <= 0 or length > limit:
        return None
    try:
        data = json.loads(request.body)  # bytes: UTF-8 (or -16/-32 with a BOM), else ValueError
    except (ValueError, RecursionError):
        return None
    return field_text(data.get(name)) if isinstance(data, dict) else None


def _param(source: str, name: str) -> KeyFunc:
    if source == "get":
        def key(request: HttpRequest) -> str:
            return request.GET.get(name) or ABSENT
    else:
        def key(request: HttpRequest) -> str:
            return body_field(request, name) or ABSENT

    return key


_NAMED: dict[str, KeyFunc] = {"ip": _ip, "user": _user, "user_or_ip": _user_or_ip}


def normalized(identity: str | bytes | int) -> str | bytes | int:
    """A policy's ``"normalize": True``: one identity for one person however they type it.
    Unicode NFKC (full-width and composed forms), surrounding whitespace stripped, case folded:
    ``"Mallory "``, ``"MALLORY"`` and the full-width ``"MALLORY"`` are ``"mallory"``. A value
    that is empty after it is the shared absent identity. Other than text is kept as it is."""
    if not isinstance(identity, str) or identity is ABSENT:
        return identity
    text = unicodedata.normalize("NFKC", identity[:4096]).strip().casefold()
    return text or ABSENT


# What each key kind yields, for the messages that refuse an identity it never could.
_FORMS = {
    "ip": "an address as the ip key masks it (IPV4_MASK/IPV6_MASK), e.g. '203.0.113.7', "
          "'2001:db8::/64', or 'unknown-address'",
    "user": "'u' and the user's primary key, e.g. 'u42', or the User itself",
}


def user_identity(value: object) -> str | None:
    """``u<pk>`` for a user model instance (anything with ``pk`` and ``is_authenticated``)."""
    if getattr(value, "is_authenticated", False) is True and getattr(value, "pk", None) is not None:
        return f"u{value.pk}"  # type: ignore[attr-defined]
    return None


def _address_identity(text: str) -> str | None:
    """The ``ip`` key's identity for an address (masked) or a network of the mask's size."""
    if text == UNKNOWN_ADDRESS:
        return text
    if "/" in text:
        try:
            network = ipaddress.ip_network(text, strict=False)
        except ValueError:
            return None
        return masked(str(network.network_address)) if network.prefixlen >= (
            settings.IPV4_MASK if network.version == 4 else settings.IPV6_MASK) else None
    return masked(text)


# The key spec of a DRF scope's policy (django_redislua.drf.scope_policy): its throttles key
# by DRF's cache key, "throttle_<scope>_<ident>" (the user's pk, else the masked address).
DRF_SCOPE_KEY = "drf-scope:"


def _scope_identity(scope: str, value: object) -> str:
    head = f"throttle_{scope}_"
    user = user_identity(value)
    text = as_text(value)
    if user is not None:
        return head + user[1:]
    if text.startswith(head):
        return text
    address = _address_identity(text)
    if address is not None and address != UNKNOWN_ADDRESS:
        return head + address
    raise ValueError(f"DRF's {scope!r} throttle never yields {text[:40]!r}: it yields "
                     f"'{head}<user id>' or '{head}<address>' (e.g. '{head}42', or the User, "
                     "or the address)")


def identity_for(spec: Any, value: object, normalize: bool = False) -> str | bytes | int:
    """The identity the key ``spec`` yields for ``value``, what a person naturally has: a
    request (the key function is applied), a ``User`` (``u<pk>`` for the user keys), an
    address (masked as the ``ip`` key masks it), or the identity itself. ValueError, with the
    form that key yields, for a value it never could (``"42"`` for the ``user`` key, which
    yields ``"u42"``)."""
    if spec is None:
        spec = DEFAULT_KEY
    if spec == "direct":  # a policy decided only through its Python API: any identity
        if isinstance(value, HttpRequest) or hasattr(value, "_request"):
            spec = DEFAULT_KEY
        elif user_identity(value) is not None:
            return cast(str, user_identity(value))
        elif isinstance(value, str | bytes | int) and not isinstance(value, bool):
            return value
    if isinstance(spec, str) and spec.startswith(DRF_SCOPE_KEY):
        return _scope_identity(spec.removeprefix(DRF_SCOPE_KEY), value)
    if isinstance(value, HttpRequest) or hasattr(value, "_request"):  # Django's or DRF's
        identity = key_function(spec)(value)  # type: ignore[arg-type]
        if identity is None:
            raise ValueError(f"the key {_name(spec)} yields nothing for this request: it is "
                             "not limited, so an override would never match")
        return normalized(identity) if normalize else identity
    user = user_identity(value)
    if spec in ("user", "user_or_ip"):
        if user is not None:
            return user
        text = as_text(value)
        if spec == "user_or_ip":
            address = _address_identity(text)
            if address is not None:
                return address
        if len(text) > 1 and text[0] == "u" and not text.isdigit():
            return text
        forms = _FORMS["user"] + ("; or " + _FORMS["ip"] if spec == "user_or_ip" else "")
        hint = f" (write 'u{text}' for user {text})" if text.isdigit() else ""
        raise ValueError(f"the key {spec!r} never yields {text[:40]!r}{hint}: it yields {forms}")
    if spec == "ip":
        text = as_text(value)
        address = _address_identity(text)
        if address is None:
            raise ValueError(f"the key 'ip' never yields {text[:40]!r}: it yields {_FORMS['ip']}")
        return address
    if user is not None:
        raise ValueError(f"the key {_name(spec)} does not key by user: give the value it reads "
                         "(or a request), not a User")
    if isinstance(value, str) and value == ABSENT_TEXT:
        return ABSENT  # the shared identity of requests lacking the value (see ABSENT)
    if not isinstance(value, str | bytes | int) or isinstance(value, bool):
        raise ValueError(f"an identity is a string (or a request, or a User), not {value!r:.40}")
    return normalized(value) if normalize else value


def _name(spec: Any) -> str:
    return repr(spec) if isinstance(spec, str) else getattr(spec, "__qualname__", repr(spec))


def key_function(spec: Any) -> KeyFunc:
    """Turn a key spec into ``(request) -> str | None``; PolicyError (redislua.E008) if unknown."""
    if spec is None:
        spec = DEFAULT_KEY
    if callable(spec):
        return spec  # type: ignore[no-any-return]
    if isinstance(spec, str):
        return _key_function_for_string(spec)
    raise PolicyError("redislua.E008", f"key {spec!r} is not a key type, callable or dotted path")


@functools.lru_cache(maxsize=512)
def _key_function_for_string(spec: str) -> KeyFunc:
    # Cached: the decorator and middleware resolve their key on every request.
    if spec in _NAMED:
        return _NAMED[spec]
    kind, sep, name = spec.partition(":")
    if sep and kind in PARAM_KEYS and name:
        return _header(name) if kind == "header" else _param(kind, name)
    if not sep and "." in spec:
        return resolve_callable(spec, "redislua.E008", "key")
    raise PolicyError(
        "redislua.E008",
        f"unknown key type {spec!r}: use ip, user, user_or_ip, header:<name>, get:<param>, "
        "post:<param>, a callable or a dotted path",
    )
