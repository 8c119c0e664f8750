"""Resilience: circuit breaker and bulkhead, inbound (``service.use_resilience(...)``) and outbound.

Inbound layers are built from ``[middleware.resilience]`` where the operator asks for them (see
docs/resilience.md). For outbound calls, :func:`outbound_guard` builds a :class:`Guard` (bulkhead, then
breaker, then the call) from the same settings; :class:`ResilientTransport` puts one under any
``httpx.AsyncClient``.
"""

from bastion.resilience._outbound import outbound_guard
from bastion_core import (
    BreakerState,
    Bulkhead,
    BulkheadFullError,
    CircuitBreaker,
    CircuitOpenError,
    Guard,
    ResilientTransport,
)

__all__ = [
    "BreakerState",
    "Bulkhead",
    "BulkheadFullError",
    "CircuitBreaker",
    "CircuitOpenError",
    "Guard",
    "ResilientTransport",
    "outbound_guard",
]
