"""Rate limiting in the HTTP pipeline: after token auth, before policy, on the full canonical path."""

from __future__ import annotations

from collections.abc import Iterable

from bastion._audit import Auditor
from bastion._cache_store import DeferredRevocation
from bastion._health import ALWAYS_PUBLIC
from bastion._metrics import NO_METRICS, Metrics
from bastion.errors import RateLimitExceeded
from bastion.ratelimit._buckets import LimiterStore, Outcome, RuleSet
from bastion.types import (
    RESPONSE_START,
    SCOPE_DEFERRED_REVOCATION,
    SCOPE_RESPONSE_HEADERS,
    ASGIApp,
    Receive,
    Scope,
    Send,
)

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
) -> Outcome:
    """Charge the request's bucket; on a spent bucket emit ``HttpRequestDenied`` and raise RateLimitExceeded.

    Shared by the HTTP middleware and gRPC calls (whose scope has ``method`` POST and ``path`` the method).
    A cache-store failure propagates as CacheStoreError, without an audit event.
    """
    bucket = rules.bucket_for(scope, trust_forwarded=trust_forwarded)
    deferred: DeferredRevocation | None = scope.pop(SCOPE_DEFERRED_REVOCATION, None)
    if deferred is None:
        outcome = await store.charge(bucket)
    else:
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
        raise RateLimitExceeded(retry_after=outcome.retry_after_secs, headers=outcome.headers())
    if metrics.traced:
        metrics.rate_limit_passed(bucket_kind(bucket.key))
    return outcome


class RateLimitMiddleware:
    """Charge each HTTP request to a user, client or IP bucket (or a route rule's); reject spent buckets.

    Reads scope[SCOPE_CLAIMS], so it sits inside TokenAuthMiddleware and outside PolicyMiddleware; reads the
    canonical ``scope["path"]`` (full path, before any prefix stripping). Raises RateLimitExceeded (429,
    with ``Retry-After`` and the ``X-RateLimit-*`` headers) after emitting ``HttpRequestDenied``; lets
    CacheStoreError (500) through without an audit event. Allowed requests get ``X-RateLimit-Limit``,
    ``-Remaining`` and ``-Reset`` on their response, errors raised further in included (via
    scope[SCOPE_RESPONSE_HEADERS]). ``/health`` and ``/ready`` are not limited.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: LimiterStore,
        rules: RuleSet,
        trust_forwarded: bool = False,
        auditor: Auditor | None = None,
        exempt_paths: Iterable[str] = ALWAYS_PUBLIC,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.store = store
        self.rules = rules
        self.trust_forwarded = trust_forwarded
        self.auditor = auditor
        self.exempt_paths = frozenset(exempt_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in RESPONSE_START or scope["path"] in self.exempt_paths:
            deferred = scope.pop(SCOPE_DEFERRED_REVOCATION, None)
            if deferred is not None:  # never the case today (token auth skips these paths too): check it alone
                await deferred.check()
            await self.app(scope, receive, send)
            return
        outcome = await charge(
            scope,
            store=self.store,
            rules=self.rules,
            trust_forwarded=self.trust_forwarded,
            auditor=self.auditor,
            metrics=self.metrics,
        )
        # The quota headers go on every response of the request, errors raised further in included; the
        # request-id step adds them (the one place response headers are added).
        scope[SCOPE_RESPONSE_HEADERS] = [*scope.get(SCOPE_RESPONSE_HEADERS, ()), *outcome.raw_headers()]
        await self.app(scope, receive, send)
