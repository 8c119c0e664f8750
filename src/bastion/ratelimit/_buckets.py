"""Bucket selection: which counter a request is charged to, under which key, with which quota.

Spec, limits / rate limiting 1, 4-7. Each request is charged to exactly one bucket:

1. a matching route rule (see :mod:`bastion.ratelimit._rules`): ``route:<route>:user:<sub>`` for a caller
   with a ``sub`` (``route:<route>:client:<client_id>`` / ``route:<route>:ip:<address>`` for callers
   without one) when ``per_user = true``; ``route:<route>:global``, shared by every caller, when false;
2. otherwise the global bucket ``rate_limit:<identifier>:<window>``: ``<identifier>`` is ``user:<sub>``
   (``per_user_rpm``), else ``client:<client_id>`` (``per_client_rpm``), else ``ip:<address>``
   (``per_ip_rpm``); ``<window>`` is ``window_secs``, e.g. ``rate_limit:user:alice:60``.

``<route>`` is the rule's canonical pattern, e.g. ``route:POST /api/*/documents:user:alice``.

A bucket may have several windows, all charged in one check (a request passes only when every window allows it,
and then counts in each): a route rule with several rates (each key then ends in ``:<period_secs>``), and a
caller whose ``plan_claim`` names a ``[rate_limit.plans.<name>]`` (its ``per_second`` / ``per_hour`` / ``per_day``
windows beside the ``window_secs`` one: ``rate_limit:user:alice:60`` and ``rate_limit:user:alice:86400``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol

from bastion._client_ip import client_ip
from bastion.config import PlanSettings, RateLimitSettings
from bastion.errors import ConfigError
from bastion.ratelimit._rules import Quota, RouteRule, RouteRules
from bastion.types import SCOPE_CLAIMS, Scope

GLOBAL_PREFIX = "rate_limit"
ROUTE_PREFIX = "route"


class Bucket(NamedTuple):
    """One counter: its key in the limiter store and the quota it is held to, plus the further windows charged in
    the same check (``more``: ``(key, quota)`` pairs, e.g. a plan's day window beside its minute window).

    A NamedTuple rather than a frozen dataclass because one is built per request: constructing a frozen
    dataclass costs about 1.3 us here, a NamedTuple 0.35 us (see docs/ratelimit.md, per-request cost).
    ``local_fallback``: counted in this process while the cache store is down (``on_store_error = "local"``).
    """

    key: str
    quota: Quota
    more: tuple[tuple[str, Quota], ...] = ()
    local_fallback: bool = False

    def windows(self) -> tuple[tuple[str, Quota], ...]:
        """Every ``(key, quota)`` of the bucket, ``(key, quota)`` first."""
        return ((self.key, self.quota), *self.more)


WindowState = tuple[Quota, bool, int, float, float]
"""One window after a charge: ``(quota, allowed, remaining, retry_after, reset_after)`` (seconds)."""


class Outcome(NamedTuple):
    """The result of charging one request to a bucket (immutable; a NamedTuple for the same reason as Bucket).

    ``remaining`` is how many more requests the bucket allows right now; ``retry_after`` (seconds, 0 when
    allowed) when the next one will be; ``reset_at`` (Unix seconds) when the bucket is full again. With several
    windows these are the most restrictive window's; ``windows`` holds each one (empty: the one ``limit``).
    """

    allowed: bool
    limit: int
    remaining: int
    retry_after: float
    reset_at: float
    windows: tuple[WindowState, ...] = ()
    period_secs: float = 0.0

    @property
    def retry_after_secs(self) -> int:
        """``Retry-After`` in whole seconds, rounded up: a client that waits this long is let through."""
        return max(1, math.ceil(self.retry_after)) if not self.allowed else 0

    def headers(self, *, ietf: bool = False) -> list[tuple[str, str]]:
        """``X-RateLimit-Limit``, ``X-RateLimit-Remaining`` and ``X-RateLimit-Reset`` (Unix seconds); with ``ietf``
        also ``RateLimit-Policy`` and ``RateLimit`` (draft-ietf-httpapi-ratelimit-headers)."""
        return [(name.decode(), value.decode()) for name, value in self.raw_headers(ietf=ietf)]

    def raw_headers(self, *, ietf: bool = False) -> list[tuple[bytes, bytes]]:
        """The same headers as ASGI byte pairs."""
        headers = [
            (b"x-ratelimit-limit", b"%d" % self.limit),
            (b"x-ratelimit-remaining", b"%d" % (self.remaining if self.allowed else 0)),
            (b"x-ratelimit-reset", b"%d" % math.ceil(self.reset_at)),
        ]
        if ietf:
            headers += ietf_fields(self)
        return headers


def window_name(period_secs: float) -> str:
    """A window's name in ``RateLimit-Policy``: ``second``, ``minute``, ``hour``, ``day``, else ``<n>s``."""
    return WINDOW_NAMES.get(period_secs) or f"{period_secs:g}s"


WINDOW_NAMES = {1.0: "second", 60.0: "minute", 3600.0: "hour", 86_400.0: "day"}


def ietf_fields(outcome: Outcome) -> list[tuple[bytes, bytes]]:
    """``RateLimit-Policy`` (every window: ``"minute";q=600;w=60``) and ``RateLimit`` (the most restrictive
    window: ``"minute";r=12;t=5``, ``t`` the seconds until it is full again)."""
    windows = outcome.windows
    if windows:
        policy = ", ".join(f'"{window_name(q.period_secs)}";q={q.limit};w={q.period_secs:g}' for q, *_ in windows)
    else:
        policy = f'"{window_name(outcome.period_secs)}";q={outcome.limit};w={outcome.period_secs:g}'
    tightest = window_name(outcome.period_secs)
    remaining = outcome.remaining if outcome.allowed else 0
    reset = max(0, math.ceil(outcome.retry_after if not outcome.allowed else outcome.reset_at - time.time()))
    return [
        (b"ratelimit-policy", policy.encode()),
        (b"ratelimit", f'"{tightest}";r={remaining};t={reset}'.encode()),
    ]


def combine(windows: tuple[WindowState, ...], reset_base: float) -> Outcome:
    """One Outcome from the windows of one charge.

    Allowed when every window allows. A refusal reports the window that refuses longest; an allowed request the
    window with the fewest requests left. ``reset_base`` (Unix seconds) dates the reset. (Plain loops: this runs
    per request.)
    """
    refused: WindowState | None = None
    fewest: WindowState | None = None
    for window in windows:
        if not window[1]:
            if refused is None or window[3] > refused[3]:
                refused = window
        elif fewest is None or window[2] < fewest[2]:
            fewest = window
    pick = refused or fewest
    assert pick is not None
    quota = pick[0]
    allowed = refused is None
    return Outcome(
        allowed,
        quota.limit,
        pick[2] if allowed else 0,
        pick[3],
        reset_base + pick[4],
        windows,
        quota.period_secs,
    )


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


Windows = tuple[tuple[int, Quota], ...]
"""A global bucket's windows: ``(period in seconds for the key, quota)``, the ``window_secs`` one first."""


class RuleSet:
    """The global quotas, the plans and the compiled route rules: picks the bucket for each request.

    Built once from ``[rate_limit]`` (ConfigError for a bad route pattern or plan); :meth:`bucket_for` reads
    scope[SCOPE_CLAIMS], the method, the canonical path and (for the IP bucket) the client address.
    ``unknown_plan`` is called with nothing when a caller's plan claim names no plan (the default limits apply).
    """

    def __init__(
        self,
        *,
        user: Quota,
        client: Quota,
        ip: Quota,
        window_secs: int,
        routes: RouteRules | None = None,
        plan_claim: str | None = None,
        plans: Mapping[str, Mapping[str, Windows]] | None = None,
        local_fallback: bool = False,
        unknown_plan: Callable[[], None] | None = None,
    ) -> None:
        self.quotas = {"user": user, "client": client, "ip": ip}
        self.window_secs = window_secs
        self.routes = routes or RouteRules()
        self._has_routes = bool(self.routes)
        self.plan_claim = plan_claim
        self.plans = dict(plans or {})
        self.local_fallback = local_fallback
        self.unknown_plan = unknown_plan

    @classmethod
    def from_settings(cls, settings: RateLimitSettings, *, unknown_plan: Callable[[], None] | None = None) -> RuleSet:
        window, burst = settings.window_secs, settings.burst_size or 0
        return cls(
            user=Quota(limit=settings.per_user_rpm, period_secs=window, burst=burst),
            client=Quota(limit=settings.per_client_rpm, period_secs=window, burst=burst),
            ip=Quota(limit=settings.per_ip_rpm, period_secs=window, burst=burst),
            window_secs=window,
            routes=RouteRules.from_settings(settings.routes, on_store_error=settings.on_store_error),
            plan_claim=settings.plan_claim,
            plans={name: plan_windows(name, plan, settings) for name, plan in settings.plans.items()},
            local_fallback=settings.on_store_error == "local",
            unknown_plan=unknown_plan,
        )

    def bucket_for(self, scope: Scope, *, trust_forwarded: bool = False) -> Bucket:
        """The bucket this request is charged to (route rule first, else the caller's global bucket, with its
        plan's windows when it has a plan)."""
        rule = self.routes.match(scope.get("method", "GET"), scope["path"]) if self._has_routes else None
        if rule is not None and not rule.per_user:
            return _route_bucket(rule, route_key(rule.name))
        kind, identifier = caller_identifier(scope, trust_forwarded=trust_forwarded)
        if rule is not None:
            return _route_bucket(rule, route_key(rule.name, kind, identifier))
        if self.plans and kind != "ip":
            windows = self._plan(scope.get(SCOPE_CLAIMS), kind)
            if windows is not None:
                prefix = f"{GLOBAL_PREFIX}:{kind}:{identifier}:"
                (period, quota), *more = windows
                more_keys = tuple([(f"{prefix}{p}", q) for p, q in more])
                return Bucket(f"{prefix}{period}", quota, more_keys, self.local_fallback)
        return Bucket(global_key(kind, identifier, self.window_secs), self.quotas[kind], (), self.local_fallback)

    def _plan(self, claims: object, kind: str) -> Windows | None:
        extra = getattr(claims, "extra", None) or {}
        assert self.plan_claim is not None
        name = extra.get(self.plan_claim)
        if name is None:
            return None
        plan = self.plans.get(name) if isinstance(name, str) else None
        if plan is None:
            if self.unknown_plan is not None:
                self.unknown_plan()
            return None
        return plan[kind]


def plan_windows(name: str, plan: PlanSettings, settings: RateLimitSettings) -> dict[str, Windows]:
    """A plan's windows for the user and the client bucket: ``window_secs`` with the plan's (else the default)
    per-window rate, then its ``per_second`` / ``per_hour`` / ``per_day`` windows. ConfigError when one of those
    is ``window_secs`` itself (two limits on one window)."""
    window, burst = settings.window_secs, plan.burst_size or settings.burst_size or 0
    more = [(1, plan.per_second), (3600, plan.per_hour), (86_400, plan.per_day)]
    extra = tuple((period, Quota(limit=limit, period_secs=period)) for period, limit in more if limit is not None)
    for period, _ in extra:
        if period == window:
            raise ConfigError(
                f"rate_limit.plans.{name}: a {period}-second window is rate_limit.window_secs already: use "
                "per_user_rpm / per_client_rpm for it"
            )
    return {
        kind: ((window, Quota(limit=limit, period_secs=window, burst=burst)), *extra)
        for kind, limit in (
            ("user", plan.per_user_rpm or settings.per_user_rpm),
            ("client", plan.per_client_rpm or settings.per_client_rpm),
        )
    }


def _route_bucket(rule: RouteRule, key: str) -> Bucket:
    """A route rule's bucket: one key, or with several windows one key per window (``<key>:<period>``)."""
    if not rule.more:
        return Bucket(key, rule.quota, (), rule.local_fallback)
    return Bucket(
        f"{key}:{rule.quota.period_secs:g}",
        rule.quota,
        tuple((f"{key}:{q.period_secs:g}", q) for q in rule.more),
        rule.local_fallback,
    )
