"""Bucket selection: which counter a request is charged to, under which key, with which quota.

Spec, limits / rate limiting 1, 4-7. Each request is charged to exactly one bucket:

1. a matching route rule (see :mod:`bastion.ratelimit._rules`): ``route:<route>:user:<sub>`` for a caller
   with a ``sub`` (``route:<route>:client:<client_id>`` / ``route:<route>:ip:<address>`` for callers
   without one) when ``per_user = true``; ``route:<route>:global``, shared by every caller, when false;
2. otherwise the global bucket ``rate_limit:<identifier>:<window>``: ``<identifier>`` is ``user:<sub>``
   (``per_user_rpm``), else ``client:<client_id>`` (``per_client_rpm``), else ``ip:<address>``
   (``per_ip_rpm``); ``<window>`` is ``window_secs``, e.g. ``rate_limit:user:alice:60``.

``<route>`` is the rule's canonical pattern, e.g. ``route:POST /api/*/documents:user:alice``.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol

from bastion._client_ip import client_ip
from bastion.config import RateLimitSettings
from bastion.ratelimit._rules import Quota, RouteRules
from bastion.types import SCOPE_CLAIMS, Scope

GLOBAL_PREFIX = "rate_limit"
ROUTE_PREFIX = "route"


class Bucket(NamedTuple):
    """One counter: its key in the limiter store and the quota it is held to.

    A NamedTuple rather than a frozen dataclass because one is built per request: constructing a frozen
    dataclass costs about 1.3 us here, a NamedTuple 0.35 us (see docs/ratelimit.md, per-request cost).
    """

    key: str
    quota: Quota


class Outcome(NamedTuple):
    """The result of charging one request to a bucket (immutable; a NamedTuple for the same reason as Bucket).

    ``remaining`` is how many more requests the bucket allows right now; ``retry_after`` (seconds, 0 when
    allowed) when the next one will be; ``reset_at`` (Unix seconds) when the bucket is full again.
    """

    allowed: bool
    limit: int
    remaining: int
    retry_after: float
    reset_at: float

    @property
    def retry_after_secs(self) -> int:
        """``Retry-After`` in whole seconds, rounded up: a client that waits this long is let through."""
        return max(1, math.ceil(self.retry_after)) if not self.allowed else 0

    def headers(self) -> list[tuple[str, str]]:
        """``X-RateLimit-Limit``, ``X-RateLimit-Remaining`` and ``X-RateLimit-Reset`` (Unix seconds)."""
        return [(name.decode(), value.decode()) for name, value in self.raw_headers()]

    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        """The same headers as ASGI byte pairs."""
        return [
            (b"x-ratelimit-limit", b"%d" % self.limit),
            (b"x-ratelimit-remaining", b"%d" % (self.remaining if self.allowed else 0)),
            (b"x-ratelimit-reset", b"%d" % math.ceil(self.reset_at)),
        ]


class LimiterStore(Protocol):
    """Where bucket state lives: the in-process local limiter, the cache-store limiter, or a test fake.

    ``charge`` counts one request against ``bucket`` (unless it is refused) and says whether it may pass.
    Raises CacheStoreError when the state cannot be read or written; never lets a request through uncounted.
    """

    async def charge(self, bucket: Bucket) -> Outcome: ...


def caller_identifier(scope: Scope, *, trust_forwarded: bool) -> tuple[str, str]:
    """``("user", sub)``, else ``("client", client_id)``, else ``("ip", address)`` for the request."""
    claims = scope.get(SCOPE_CLAIMS)
    if claims is not None:
        sub = getattr(claims, "sub", None)
        if sub:
            return "user", sub
        client_id = getattr(claims, "client_id", None)
        if client_id:
            return "client", client_id
    return "ip", client_ip(scope, trust_forwarded=trust_forwarded)


def global_key(kind: str, identifier: str, window_secs: int) -> str:
    """``rate_limit:<kind>:<identifier>:<window_secs>``, e.g. ``rate_limit:user:alice:60``."""
    return f"{GLOBAL_PREFIX}:{kind}:{identifier}:{window_secs}"


def route_key(route: str, kind: str | None = None, identifier: str | None = None) -> str:
    """``route:<route>:user:<sub>`` (or ``:client:`` / ``:ip:``), or ``route:<route>:global`` without a caller."""
    if kind is None:
        return f"{ROUTE_PREFIX}:{route}:global"
    return f"{ROUTE_PREFIX}:{route}:{kind}:{identifier}"


class RuleSet:
    """The global quotas plus the compiled route rules: picks the bucket for each request.

    Built once from ``[rate_limit]`` (ConfigError for a bad route pattern); :meth:`bucket_for` reads
    scope[SCOPE_CLAIMS], the method, the canonical path and (for the IP bucket) the client address.
    """

    def __init__(
        self,
        *,
        user: Quota,
        client: Quota,
        ip: Quota,
        window_secs: int,
        routes: RouteRules | None = None,
    ) -> None:
        self.quotas = {"user": user, "client": client, "ip": ip}
        self.window_secs = window_secs
        self.routes = routes or RouteRules()
        self._has_routes = bool(self.routes)

    @classmethod
    def from_settings(cls, settings: RateLimitSettings) -> RuleSet:
        window, burst = settings.window_secs, settings.burst_size or 0
        return cls(
            user=Quota(limit=settings.per_user_rpm, period_secs=window, burst=burst),
            client=Quota(limit=settings.per_client_rpm, period_secs=window, burst=burst),
            ip=Quota(limit=settings.per_ip_rpm, period_secs=window, burst=burst),
            window_secs=window,
            routes=RouteRules.from_settings(settings.routes),
        )

    def bucket_for(self, scope: Scope, *, trust_forwarded: bool = False) -> Bucket:
        """The one bucket this request is charged to (route rule first, else the caller's global bucket)."""
        rule = self.routes.match(scope.get("method", "GET"), scope["path"]) if self._has_routes else None
        if rule is not None and not rule.per_user:
            return Bucket(route_key(rule.name), rule.quota)
        kind, identifier = caller_identifier(scope, trust_forwarded=trust_forwarded)
        if rule is not None:
            return Bucket(route_key(rule.name, kind, identifier), rule.quota)
        return Bucket(global_key(kind, identifier, self.window_secs), self.quotas[kind])
