"""Idempotent retries: an ``Idempotency-Key`` replays the stored response instead of running the handler again.

Configured by ``[idempotency]`` and the route option ``idempotency=True`` (docs/idempotency.md).
"""

from bastion.idempotency._keys import IdempotentRoutes
from bastion.idempotency._middleware import IdempotencyMiddleware

__all__ = ["IdempotencyMiddleware", "IdempotentRoutes"]
