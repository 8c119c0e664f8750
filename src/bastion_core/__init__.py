"""The small core Bastion and MailRelay share: clock, backoff and Retry-After, logging set-up, redaction,
configuration errors, and the resilience parts (circuit breaker, bulkhead, the outbound guard).

It imports neither FastAPI nor uvicorn nor cedarpy, so MailRelay stays light; httpx and OpenTelemetry come only
with ResilientTransport, loaded when first named."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bastion_core._backoff import (
    MAX_BACKOFF_SECS,
    MAX_RETRY_AFTER_SECS,
    backoff_delay,
    parse_retry_after,
    retry_wait,
)
from bastion_core._breaker import BreakerSnapshot, BreakerState, CircuitBreaker, CircuitOpenError, Ticket
from bastion_core._bulkhead import Bulkhead, BulkheadFullError, BulkheadSnapshot
from bastion_core._clock import Clock
from bastion_core._errors import ConfigError
from bastion_core._guard import Call, Guard
from bastion_core._logging import UNKNOWN_VARIABLE_EVENT, configure_logging, log_event
from bastion_core._loop import running_loop
from bastion_core._redact import MASK, mask_url

if TYPE_CHECKING:
    from bastion_core._resilient_transport import ResilientTransport

__all__ = [
    "MASK",
    "MAX_BACKOFF_SECS",
    "MAX_RETRY_AFTER_SECS",
    "UNKNOWN_VARIABLE_EVENT",
    "BreakerSnapshot",
    "BreakerState",
    "Bulkhead",
    "BulkheadFullError",
    "BulkheadSnapshot",
    "Call",
    "CircuitBreaker",
    "CircuitOpenError",
    "Clock",
    "ConfigError",
    "Guard",
    "ResilientTransport",
    "Ticket",
    "backoff_delay",
    "configure_logging",
    "log_event",
    "mask_url",
    "parse_retry_after",
    "retry_wait",
    "running_loop",
]


def __getattr__(name: str) -> object:
    """ResilientTransport on first use: it brings httpx and OpenTelemetry, which a user of Guard alone does not need."""
    if name == "ResilientTransport":
        from bastion_core._resilient_transport import ResilientTransport

        return ResilientTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
