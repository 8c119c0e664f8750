"""Outbound guards built from ``[middleware.resilience]``: the operator's one line per dependency."""

from __future__ import annotations

from bastion.config import ResilienceSettings, Settings
from bastion_core import Bulkhead, CircuitBreaker, Guard


def outbound_guard(settings: Settings | ResilienceSettings, name: str) -> Guard:
    """A :class:`Guard` for dependency ``name``: bulkhead outermost, then the breaker, then the call.

    Values from ``[middleware.resilience]``; a part is left out when its ``*_enabled`` key is false. Each call
    builds an independent breaker and pool. Use it as ``async with guard.call():``, as a decorator, or under
    httpx: ``httpx.AsyncClient(transport=ResilientTransport(guard))``.
    """
    resilience = settings.middleware.resilience if isinstance(settings, Settings) else settings
    breaker = (
        CircuitBreaker(
            name,
            threshold=resilience.circuit_breaker_threshold,
            min_requests=resilience.circuit_breaker_min_requests,
            wait_secs=resilience.circuit_breaker_wait_secs,
            half_open_requests=resilience.circuit_breaker_half_open_requests,
        )
        if resilience.circuit_breaker_enabled is not False
        else None
    )
    bulkhead = (
        Bulkhead(name, max_concurrent=resilience.bulkhead_max_concurrent, max_wait=resilience.bulkhead_max_wait)
        if resilience.bulkhead_enabled is not False
        else None
    )
    return Guard(breaker=breaker, bulkhead=bulkhead)
