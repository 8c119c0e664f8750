"""Where an accepted message goes: the DeliveryTarget protocol `Relay` and the queue workers depend on, and the
target-neutral words they act on (a Verdict per attempt, an Outcome, a DeliveryResult).

A target owns everything about its destination: the request it makes (for the webhook: headers and signature),
what an answer means (HTTP statuses become a Verdict inside the target), its retries in direct mode, and its
circuit breaker, which nothing outside the target reads (`pause()` is the one question the others ask).
The webhook target is `_delivery.WebhookClient`; docs/architecture.md says how to add another.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


class Verdict(enum.Enum):
    """What one attempt's answer means; the same rules in direct and queue mode."""

    DELIVERED = "delivered"  # the target took the message (webhook: 2xx)
    RETRY = "retry"  # worth another attempt (webhook: timeout, connection error, 5xx, 408, 429)
    REJECTED = "rejected"  # the target refused the message for good (webhook: any other 4xx)
    UNEXPECTED = "unexpected"  # an answer that is neither (webhook: 1xx or 3xx, most likely a wrong URL)
    CIRCUIT_OPEN = "circuit_open"  # the target's breaker refused the attempt; nothing was sent


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What one attempt came to, as the queue workers act on it.

    `problem` is short and safe to log or to put in a dead letter (`timeout`, `HTTP 503`); `status` is the code the
    target answered, when it has codes (the webhook's HTTP status; logged as is); `retry_after` is how many seconds
    the target asked to wait before the next attempt (uncapped: each mode applies its own cap), None when it did
    not say.
    """

    verdict: Verdict
    problem: str
    status: int | None = None
    retry_after: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Pause:
    """The target takes no attempts for now (its breaker is open): for `retry_in` more seconds, after which it
    lets a test attempt through. `reason` is the text of the 451 a message gets meanwhile."""

    retry_in: float
    reason: str


class DeliveryOutcome(enum.Enum):
    """How a direct-mode delivery (with its retries) ended: the DATA reply follows from it."""

    DELIVERED = "delivered"  # 250
    TEMPORARY_FAILURE = "temporary_failure"  # retries exhausted or the circuit open: 451, the sender keeps it
    REJECTED = "rejected"  # a final refusal: 554, the receiver refused it


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryResult:
    outcome: DeliveryOutcome
    attempts: int
    reason: str
    """The text of the DATA reply (never the target's address: the sending server is outside)."""
    status: int | None = None
    posted: bool = True
    """Whether any attempt left the relay (False when the circuit was open before the first one)."""
    circuit_open: bool = False
    """The breaker ended the delivery: it refused an attempt."""


class DeliveryTarget(Protocol):
    """Where accepted payloads are delivered (`_delivery.WebhookClient`).

    `pause()`: None while the target takes attempts; while its breaker is open, a Pause (the relay answers its 451
    at once, the workers stop fetching). `deliver` is direct mode: attempts
    and retries until a final answer or the budget is spent; `attempt` is queue mode's single try per delivery from
    the stream. Neither raises for the destination's trouble. `log_fields` name the target in log lines about
    trouble (for the webhook, its label: never a secret).
    """

    @property
    def log_fields(self) -> Mapping[str, str]: ...

    def pause(self) -> Pause | None: ...

    async def deliver(self, body: bytes, *, delivery_id: str) -> DeliveryResult: ...

    async def attempt(self, body: bytes, *, delivery_id: str) -> Outcome: ...
