"""Webhook delivery: one signed POST per message, retried with backoff. The only module doing network I/O."""

from __future__ import annotations

import asyncio
import enum
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
import structlog

from bastion_core import CircuitOpenError, parse_retry_after, retry_wait
from mailrelay._signing import signature_headers

DELIVERY_ID_HEADER = "X-MailRelay-Delivery-Id"
MAX_DRAINED_RESPONSE_BYTES = 64 * 1024  # read small responses so the connection can be reused
RETRYABLE_STATUSES = frozenset({408, 429})

log = structlog.get_logger("mailrelay.delivery")


def is_retryable_status(status: int) -> bool:
    """5xx, 408 and 429 are worth another attempt; other statuses are final."""
    return status >= 500 or status in RETRYABLE_STATUSES


class DeliveryOutcome(enum.Enum):
    DELIVERED = "delivered"  # 2xx
    TEMPORARY_FAILURE = "temporary_failure"  # retries exhausted: 451, the sender keeps the message
    REJECTED = "rejected"  # a final 4xx: 554, the receiver refused it


BREAKER_OPEN_REASON = "Webhook temporarily unavailable (circuit open), try again later"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryResult:
    outcome: DeliveryOutcome
    attempts: int
    reason: str
    status: int | None = None
    posted: bool = True
    """Whether any attempt left the relay (False when the circuit was open before the first one)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Attempt:
    status: int | None
    retry_after: str | None
    error: str | None
    circuit_open: bool = False


class WebhookClient:
    """POSTs payload bytes to the webhook until a final answer or the retry budget is spent.

    The httpx client's transport is expected to carry the circuit breaker (``bastion_core.ResilientTransport``):
    every attempt counts (a 5xx or a network error is a failure), and an open circuit ends the delivery at
    once with ``BREAKER_OPEN_REASON``, without a POST.

    Every attempt carries Content-Type, User-Agent and the delivery id (the same on every retry);
    with a secret, X-MailRelay-Timestamp and X-MailRelay-Signature-256 are recomputed per attempt
    over the exact bytes sent. Timeouts, connection errors, 5xx, 408 and 429 are retried up to
    `max_retries` more times, waiting the server's Retry-After or a jittered exponential backoff.
    Never raises for HTTP or network trouble; the result says what happened.
    """

    def __init__(
        self,
        *,
        client: httpx.AsyncClient,
        url: str,
        user_agent: str,
        secret: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        backoff_base: float = 1.0,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        random: Callable[[], float] = random.random,
    ) -> None:
        self.client = client
        self.url = url
        self.user_agent = user_agent
        self.secret = secret
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._random = random

    async def deliver(self, body: bytes, *, delivery_id: str) -> DeliveryResult:
        attempts = 0
        while True:
            attempts += 1
            attempt = await self._attempt(body, delivery_id)
            if attempt.circuit_open:
                # The breaker refused the attempt without sending it: no retry can get through for now.
                log.warning("webhook_circuit_open", delivery_id=delivery_id, attempts=attempts)
                return DeliveryResult(
                    outcome=DeliveryOutcome.TEMPORARY_FAILURE,
                    attempts=attempts - 1,
                    reason=BREAKER_OPEN_REASON,
                    posted=attempts > 1,
                )
            status = attempt.status
            if status is not None and 200 <= status < 300:
                log.info("webhook_delivered", delivery_id=delivery_id, status=status, attempts=attempts)
                return DeliveryResult(
                    outcome=DeliveryOutcome.DELIVERED, attempts=attempts, status=status, reason="delivered"
                )
            if status is not None and not is_retryable_status(status):
                outcome = DeliveryOutcome.REJECTED if 400 <= status < 500 else DeliveryOutcome.TEMPORARY_FAILURE
                reason = (
                    f"Webhook refused the message (HTTP {status})"
                    if outcome is DeliveryOutcome.REJECTED
                    else f"Webhook answered HTTP {status}, try again later"
                )
                log.warning("webhook_final_answer", delivery_id=delivery_id, status=status, attempts=attempts)
                return DeliveryResult(outcome=outcome, attempts=attempts, status=status, reason=reason)
            problem = attempt.error or f"HTTP {status}"
            if attempts > self.max_retries:
                log.warning("webhook_retries_exhausted", delivery_id=delivery_id, problem=problem, attempts=attempts)
                return DeliveryResult(
                    outcome=DeliveryOutcome.TEMPORARY_FAILURE,
                    attempts=attempts,
                    status=status,
                    reason=f"Webhook delivery failed ({problem}), try again later",
                )
            wait = retry_wait(
                attempts,
                retry_after=parse_retry_after(attempt.retry_after, now=self._wall_clock()),
                base=self.backoff_base,
                random=self._random,
            )
            log.info(
                "webhook_retry_scheduled",
                delivery_id=delivery_id,
                problem=problem,
                attempt=attempts,
                wait=wait,
            )
            await self._sleep(wait)

    def headers_for(self, body: bytes, *, delivery_id: str) -> dict[str, str]:
        """The request headers of one attempt (signature computed now, over `body`)."""
        headers = {
            "Content-Type": "application/json",
            "User-Agent": self.user_agent,
            DELIVERY_ID_HEADER: delivery_id,
        }
        if self.secret is not None:
            headers.update(signature_headers(self.secret, int(self._wall_clock()), body))
        return headers

    async def _attempt(self, body: bytes, delivery_id: str) -> _Attempt:
        headers = self.headers_for(body, delivery_id=delivery_id)
        answer: _Attempt | None = None
        problem = ""
        try:
            async with asyncio.timeout(self.timeout):
                async with self.client.stream("POST", self.url, content=body, headers=headers) as response:
                    answer = _Attempt(
                        status=response.status_code,
                        retry_after=response.headers.get("retry-after"),
                        error=None,
                    )
                    length = response.headers.get("content-length", "")
                    if length.isdigit() and int(length) <= MAX_DRAINED_RESPONSE_BYTES:
                        await response.aread()
        except CircuitOpenError:
            return _Attempt(status=None, retry_after=None, error="circuit open", circuit_open=True)
        except (TimeoutError, httpx.TimeoutException):
            problem = "timeout"
        except httpx.HTTPError as exc:
            problem = f"connection error: {type(exc).__name__}"
        # The status line is the receiver's answer; the body is read only so the connection can be
        # reused. A body that stalls or is cut short must not turn a 200 into a retry (a duplicate).
        if answer is not None:
            return answer
        return _Attempt(status=None, retry_after=None, error=problem)
