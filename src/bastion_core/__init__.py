"""The small core Bastion and MailRelay share: clock, backoff and Retry-After, logging set-up, redaction,
configuration errors, and the resilience parts (circuit breaker, bulkhead, the outbound guard).

It imports neither FastAPI nor uvicorn nor cedarpy, so MailRelay stays light."""

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
from bastion_core._guard import Call, Guard, ResilientTransport
from bastion_core._logging import UNKNOWN_VARIABLE_EVENT, configure_logging, log_event
from bastion_core._loop import running_loop
from bastion_core._redact import MASK, mask_url

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
