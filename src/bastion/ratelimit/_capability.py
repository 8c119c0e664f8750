"""Rate limiting assembled from ``[rate_limit]``: rules, a limiter store and the guard that charges each request.

:class:`RateLimitGuard` (``bastion._guard``) charges HTTP requests, WebSocket handshakes and gRPC calls alike, after
token auth (it reads the claims) and before policy, on the full canonical path.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NoReturn

from bastion._audit import Auditor
from bastion._cache_store import CacheStore, DeferredRevocation
from bastion._guard import Exemptions, Later, guard_layer
from bastion._metrics import NO_METRICS, Metrics
from bastion.config import AuditSettings, RateLimitSettings
from bastion.errors import CacheStoreError, RateLimitExceeded
from bastion.ratelimit._buckets import Bucket, LimiterStore, Outcome, RuleSet
from bastion.ratelimit._distributed import DistributedLimiter
from bastion.ratelimit._local import LocalLimiter
from bastion.types import SCOPE_DEFERRED_REVOCATION, SCOPE_RESPONSE_HEADERS, ASGIApp, Scope

Layer = Callable[[ASGIApp], ASGIApp]

DENIED_EVENT = "HttpRequestDenied"
DENIED_EVENT_TYPE = "http.request.denied"


def bucket_kind(key: str) -> str:
    """``user``, ``client``, ``ip`` or ``route``: the metric label of a bucket (its key holds who it is)."""
    if key.startswith("route:"):
        return "route"
    return key.split(":", 2)[1] if key.count(":") >= 2 else "other"


async def charge(
    scope: Scope,
    *,
    store: LimiterStore,
    rules: RuleSet,
    trust_forwarded: bool,
    auditor: Auditor | None,
    metrics: Metrics = NO_METRICS,
    fallback: LocalLimiter | None = None,
    ietf: bool = False,
) -> Outcome:
    """Charge the request's bucket; on a spent bucket emit ``HttpRequestDenied`` and raise RateLimitExceeded.

    Shared by HTTP requests and gRPC calls (whose scope has ``method`` POST and ``path`` the method).
    A cache-store failure propagates as CacheStoreError, without an audit event, unless the bucket's rule says
    ``on_store_error = "local"`` and ``fallback`` is given: then the bucket is charged in ``fallback`` (this
    process) and ``bastion_rate_limit_events{event="local_fallback"}`` counts it.
    """
    bucket = rules.bucket_for(scope, trust_forwarded=trust_forwarded)
    deferred: DeferredRevocation | None = scope.pop(SCOPE_DEFERRED_REVOCATION, None)
    if deferred is None:
        try:
            outcome = await store.charge(bucket)
        except CacheStoreError:
            if fallback is None or not bucket.local_fallback:
                raise
            metrics.rate_limit_event("local_fallback")
            outcome = fallback.charge_now(bucket)
    else:  # a revocation check that cannot be made fails closed, whatever the rule says
        combined = getattr(store, "charge_unless_revoked", None)
        if combined is None:
            await deferred.check()
            outcome = await store.charge(bucket)
        else:
            charged = await combined(bucket, deferred.key)
            if charged is None:
                raise deferred.revoked()
            outcome = charged
    if not outcome.allowed:
        await refuse(scope, bucket, outcome, auditor=auditor, metrics=metrics, ietf=ietf)
    if metrics.traced:
        metrics.rate_limit_passed(bucket_kind(bucket.key))
    return outcome


async def refuse(
    scope: Scope, bucket: Bucket, outcome: Outcome, *, auditor: Auditor | None, metrics: Metrics, ietf: bool
) -> NoReturn:
    """A spent bucket: count it, emit ``HttpRequestDenied``, raise RateLimitExceeded."""
    metrics.rate_limited(bucket_kind(bucket.key))
    if auditor is not None:
        await auditor.auth_event(
            DENIED_EVENT,
            scope,
            event_type=DENIED_EVENT_TYPE,
            method=scope.get("method", "GET"),
            path=scope["path"],
            bucket=bucket.key,
            limit=outcome.limit,
            retry_after=outcome.retry_after_secs,
        )
    raise RateLimitExceeded(retry_after=outcome.retry_after_secs, headers=outcome.headers(ietf=ietf))


class RateLimitGuard:
    """The rate-limit guard of one app: compiled rules and one limiter store.

    ``RateLimiting.local(settings)`` keeps buckets in this process; ``RateLimiting.distributed(settings,
    cache_store)`` keeps them in the cache store, shared by every instance. Route patterns are compiled here,
    once (ConfigError at start-up for a bad one).
    """

    def __init__(
        self,
        settings: RateLimitSettings,
        *,
        store: LimiterStore,
        auditor: Auditor | None = None,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.rules = RuleSet.from_settings(settings, unknown_plan=partial(metrics.rate_limit_event, "unknown_plan"))
        self.store = store
        self.fallback = LocalLimiter() if isinstance(store, DistributedLimiter) else None
        """Where buckets of ``on_store_error = "local"`` rules are counted while the cache store is down."""
        # Audit events are on by default (spec): a limiter wired by hand logs HttpRequestDenied too.
        self.auditor = auditor if auditor is not None else Auditor(AuditSettings())
        self._local = store if type(store) is LocalLimiter else None
        """The local limiter charges without waiting: :meth:`check_now` needs no coroutine."""
        self._trust_forwarded = settings.trust_forwarded_headers
        self._ietf = settings.ietf_headers
        self.exemptions = Exemptions(scope_types=frozenset({"http", "websocket", "grpc"}))
        """Every request, WebSocket handshake and gRPC call is charged but ``/health``, ``/ready``, gRPC health
        and reflection."""

    @classmethod
    def local(
        cls, settings: RateLimitSettings, *, auditor: Auditor | None = None, metrics: Metrics = NO_METRICS
    ) -> RateLimitGuard:
        """In-process buckets: per instance, reset on restart."""
        return cls(settings, store=LocalLimiter(), auditor=auditor, metrics=metrics)

    @classmethod
    def distributed(
        cls,
        settings: RateLimitSettings,
        cache_store: CacheStore,
        *,
        auditor: Auditor | None = None,
        metrics: Metrics = NO_METRICS,
    ) -> RateLimitGuard:
        """Buckets in ``cache_store`` (Redis/Valkey: shared by all instances, one round trip per request)."""
        return cls(settings, store=DistributedLimiter(cache_store), auditor=auditor, metrics=metrics)

    @property
    def checks_revocation(self) -> bool:
        """Whether a revocation check left in the scope (SCOPE_DEFERRED_REVOCATION) is made in the same round trip
        as the charge: the distributed limiter on Redis/Valkey."""
        return isinstance(self.store, DistributedLimiter) and self.store.shared

    async def check(self, scope: Scope) -> None:
        """Charge the request or call (a gRPC call's scope has ``method`` POST, ``path`` the method); raise
        RateLimitExceeded (429 with ``Retry-After`` and ``X-RateLimit-*``; over gRPC RESOURCE_EXHAUSTED, the
        headers in the trailers) or CacheStoreError. An allowed request's quota headers go on its response,
        errors raised further in included: the request-id step adds scope[SCOPE_RESPONSE_HEADERS]."""
        outcome = await charge(
            scope,
            store=self.store,
            rules=self.rules,
            trust_forwarded=self.settings.trust_forwarded_headers,
            auditor=self.auditor,
            metrics=self.metrics,
            fallback=self.fallback,
            ietf=self.settings.ietf_headers,
        )
        self._quota_headers(scope, outcome)

    def check_now(self, scope: Scope) -> Later | None:
        """:meth:`check` without a coroutine for an allowed request charged to the local limiter; else the
        coroutine of the check (``bastion._guard``): another store, a revocation check left by token auth, or
        a refusal (its audit event)."""
        local = self._local
        if local is None or SCOPE_DEFERRED_REVOCATION in scope:
            return self.check(scope)
        bucket = self.rules.bucket_for(scope, trust_forwarded=self._trust_forwarded)
        outcome = local.charge_now(bucket)
        if not outcome.allowed:
            return refuse(scope, bucket, outcome, auditor=self.auditor, metrics=self.metrics, ietf=self._ietf)
        if self.metrics.traced:
            self.metrics.rate_limit_passed(bucket_kind(bucket.key))
        self._quota_headers(scope, outcome)
        return None

    def _quota_headers(self, scope: Scope, outcome: Outcome) -> None:
        headers = outcome.raw_headers(ietf=self._ietf)
        earlier = scope.get(SCOPE_RESPONSE_HEADERS)
        scope[SCOPE_RESPONSE_HEADERS] = headers if earlier is None else [*earlier, *headers]

    @property
    def layer(self) -> Layer:
        """The HTTP/WebSocket layer, for ``service.use(Slot.RATE_LIMIT, limiting.layer)`` (the guard itself,
        ``service.use(Slot.RATE_LIMIT, limiting)``, guards gRPC calls too)."""
        return guard_layer(self)


RateLimiting = RateLimitGuard
"""The name this guard is documented under for wiring a limiter by hand (``RateLimiting.local(settings)``)."""


def built_in_rate_limiting(
    settings: RateLimitSettings, *, cache_store: CacheStore, auditor: Auditor, metrics: Metrics = NO_METRICS
) -> RateLimitGuard | None:
    """What ``BastionApp`` wires into the rate-limit slot by itself.

    The distributed limiter on the app's cache store when ``distributed`` is true; else the local limiter
    when ``auto_apply`` is true; nothing when ``enabled`` is false or ``auto_apply`` is false (the operator
    then wires a limiter with ``service.use(Slot.RATE_LIMIT, ...)``).
    """
    if not settings.enabled:
        return None
    if settings.distributed:
        return RateLimitGuard.distributed(settings, cache_store, auditor=auditor, metrics=metrics)
    if settings.auto_apply:
        return RateLimitGuard.local(settings, auditor=auditor, metrics=metrics)
    return None
