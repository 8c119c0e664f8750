"""Rate limiting: per user, client and IP buckets, per-route rules, local and distributed limiters."""

from bastion.ratelimit.buckets import Bucket, LimiterStore, Outcome, RuleSet
from bastion.ratelimit.distributed import DistributedLimiter
from bastion.ratelimit.local import LocalLimiter, gcra
from bastion.ratelimit.middleware import RateLimitMiddleware
from bastion.ratelimit.rules import Quota, RouteRule, RouteRules
from bastion.ratelimit.setup import RateLimiting, built_in_rate_limiting

__all__ = [
    "Bucket",
    "DistributedLimiter",
    "LimiterStore",
    "LocalLimiter",
    "Outcome",
    "Quota",
    "RateLimitMiddleware",
    "RateLimiting",
    "RouteRule",
    "RouteRules",
    "RuleSet",
    "built_in_rate_limiting",
    "gcra",
]
