"""Rate limiting: per user, client and IP buckets, per-route rules, local and distributed limiters.

Configured by ``[rate_limit]``. Public: what an operator wiring a limiter by hand uses
(``RateLimiting.local`` / ``.distributed``) and what a custom ``LimiterStore`` implements.
"""

from bastion.ratelimit._buckets import Bucket, LimiterStore, Outcome
from bastion.ratelimit._capability import RateLimiting
from bastion.ratelimit._rules import Quota

__all__ = ["Bucket", "LimiterStore", "Outcome", "Quota", "RateLimiting"]
