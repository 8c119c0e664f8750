"""Rate limiting assembled from ``[rate_limit]`` settings: rules, a limiter store and the middleware factory."""

from __future__ import annotations

from bastion._audit import Auditor
from bastion._cache_store import CacheStore
from bastion._metrics import NO_METRICS, Metrics
from bastion.config import AuditSettings, RateLimitSettings
from bastion.ratelimit._buckets import LimiterStore, RuleSet
from bastion.ratelimit._distributed import DistributedLimiter
from bastion.ratelimit._local import LocalLimiter
from bastion.ratelimit._middleware import RateLimitMiddleware, charge
from bastion.types import ASGIApp, Scope


class RateLimiting:
    """The rate-limit capability of one app: compiled rules, one limiter store, and :meth:`layer`.

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
        self.rules = RuleSet.from_settings(settings)
        self.store = store
        # Audit events are on by default (spec): a limiter wired by hand logs HttpRequestDenied too.
        self.auditor = auditor if auditor is not None else Auditor(AuditSettings())

    @classmethod
    def local(
        cls, settings: RateLimitSettings, *, auditor: Auditor | None = None, metrics: Metrics = NO_METRICS
    ) -> RateLimiting:
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
    ) -> RateLimiting:
        """Buckets in ``cache_store`` (Redis/Valkey: shared by all instances, one round trip per request)."""
        return cls(settings, store=DistributedLimiter(cache_store), auditor=auditor, metrics=metrics)

    @property
    def checks_revocation(self) -> bool:
        """Whether a revocation check left in the scope (SCOPE_DEFERRED_REVOCATION) is made in the same round trip
        as the charge: the distributed limiter on Redis/Valkey."""
        return isinstance(self.store, DistributedLimiter) and self.store.shared

    async def check_call(self, scope: Scope) -> None:
        """Charge one gRPC call (scope ``method`` POST, ``path`` the method); raises RateLimitExceeded (its
        headers become trailing metadata) or CacheStoreError."""
        await charge(
            scope,
            store=self.store,
            rules=self.rules,
            trust_forwarded=self.settings.trust_forwarded_headers,
            auditor=self.auditor,
            metrics=self.metrics,
        )

    def layer(self, app: ASGIApp) -> ASGIApp:
        """The middleware over ``app``, for ``service.use(Slot.RATE_LIMIT, limiting.layer)``."""
        return RateLimitMiddleware(
            app,
            store=self.store,
            rules=self.rules,
            trust_forwarded=self.settings.trust_forwarded_headers,
            auditor=self.auditor,
            metrics=self.metrics,
        )


def built_in_rate_limiting(
    settings: RateLimitSettings, *, cache_store: CacheStore, auditor: Auditor, metrics: Metrics = NO_METRICS
) -> RateLimiting | None:
    """What ``BastionApp`` wires into the rate-limit slot by itself.

    The distributed limiter on the app's cache store when ``distributed`` is true; else the local limiter
    when ``auto_apply`` is true; nothing when ``enabled`` is false or ``auto_apply`` is false (the operator
    then wires a limiter with ``service.use(Slot.RATE_LIMIT, ...)``).
    """
    if not settings.enabled:
        return None
    if settings.distributed:
        return RateLimiting.distributed(settings, cache_store, auditor=auditor, metrics=metrics)
    if settings.auto_apply:
        return RateLimiting.local(settings, auditor=auditor, metrics=metrics)
    return None
