"""The webhook delivery target: the request of one attempt (headers, signature), what its HTTP answer means, and
direct mode's retry loop. The HTTP itself is a WebhookTransport (`_transport.py`: aiohttp under the breaker)."""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import structlog

from bastion_core import BreakerState, CircuitBreaker, parse_retry_after, retry_wait
from bastion_core._logging import info_dropped
from mailrelay._signing import Signer
from mailrelay._target import DeliveryOutcome, DeliveryResult, Outcome, Pause, Verdict

DELIVERY_ID_HEADER = "X-MailRelay-Delivery-Id"
RETRYABLE_STATUSES = frozenset({408, 429})
OFFLOAD_SIGNING_BYTES = 256 * 1024  # HMAC-SHA256 takes ~2 ms per MB: bigger bodies are signed on a worker thread
BREAKER_OPEN_REASON = "Webhook temporarily unavailable (circuit open), try again later"
TIMEOUT_PROBLEM = "timeout"  # Attempt.error when no answer came within the attempt's time

log = structlog.get_logger("mailrelay.delivery")


def is_retryable_status(status: int) -> bool:
    """5xx, 408 and 429 are worth another attempt; other statuses are final."""
    return status >= 500 or status in RETRYABLE_STATUSES


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """What one POST came to: the answer's status (and Retry-After), or the problem that kept it from one.

    `circuit_open` means the breaker refused the attempt: nothing was sent.
    """

    status: int | None = None
    retry_after: str | None = None
    error: str | None = None
    circuit_open: bool = False

    @property
    def problem(self) -> str:
        """Short and safe to log or to put in a reply: `timeout`, `connection error: ...`, `HTTP 503`."""
        return self.error or f"HTTP {self.status}"


def judge(attempt: Attempt) -> Verdict:
    """What a POST's answer means: 2xx delivered; timeout, connection error, 5xx, 408, 429 retry; any other 4xx
    rejected; 1xx or 3xx (redirects are not followed) unexpected; the same rules in direct and queue mode."""
    if attempt.circuit_open:
        return Verdict.CIRCUIT_OPEN
    status = attempt.status
    if status is None or is_retryable_status(status):
        return Verdict.RETRY
    if 200 <= status < 300:
        return Verdict.DELIVERED
    if 400 <= status < 500:
        return Verdict.REJECTED
    return Verdict.UNEXPECTED


def outcome_of(attempt: Attempt, *, now: float) -> Outcome:
    """A POST's answer in the target-neutral words the queue workers act on; Retry-After (seconds or an HTTP date,
    read against `now`) is left uncapped: queue mode caps it at its own backoff cap."""
    return Outcome(
        verdict=judge(attempt),
        problem=attempt.problem,
        status=attempt.status,
        retry_after=parse_retry_after(attempt.retry_after, now=now, cap=math.inf),
    )


class WebhookTransport(Protocol):
    """Sends one POST of `body` with `headers` to the webhook and says what came of it.

    Never raises for HTTP or network trouble (the Attempt carries it); bounded in time by the transport.
    """

    async def post(self, body: bytes, headers: Mapping[str, str]) -> Attempt: ...


def webhook_label(url: str) -> str:
    """How logs name the webhook: its origin, then ``/…`` for any path, and the first 8 hex digits of the URL's
    SHA-256 to tell webhooks apart (``https://hooks.example/… #3f2a9c01``). Nothing else of the URL: a
    password, a query and, in capability URLs (Slack's ``/services/T../B../<secret>``), the path are secrets."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    origin = f"{parts.scheme}://{f'[{host}]' if ':' in host else host}{f':{parts.port}' if parts.port else ''}"
    path = "/…" if parts.path not in ("", "/") or parts.query else ""
    return f"{origin}{path} #{hashlib.sha256(url.encode()).hexdigest()[:8]}"


class WebhookClient:
    """The webhook DeliveryTarget: builds each attempt's request and, in direct mode, retries until a final answer
    or the budget is spent.

    Every attempt carries Content-Type, User-Agent and the delivery id (the same on every retry); with a secret,
    X-MailRelay-Timestamp and X-MailRelay-Signature-256 are recomputed per attempt over the exact bytes sent
    (on a worker thread for bodies over `offload_bytes`). `deliver` retries timeouts, connection errors, 5xx, 408
    and 429 up to `max_retries` more times, waiting the server's Retry-After or a jittered exponential backoff;
    an open circuit ends it at once with BREAKER_OPEN_REASON. Never raises for HTTP or network trouble.
    `breaker` is the one in the transport's guard: `pause()` reads it, and nothing else outside the transport does.
    """

    def __init__(
        self,
        *,
        transport: WebhookTransport,
        user_agent: str,
        breaker: CircuitBreaker | None = None,
        secret: str | None = None,
        max_retries: int = 3,
        backoff_base: float = 1.0,
        offload_bytes: int = OFFLOAD_SIGNING_BYTES,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        random: Callable[[], float] = random.random,
        url: str | None = None,
    ) -> None:
        self.transport = transport
        self.breaker = breaker
        # Log lines about trouble name the webhook: an operator reading "webhook_retries_exhausted" should not
        # have to look up which URL this relay posts to. The SMTP reply does not: the sending server is outside,
        # and the address of an internal service is not its business.
        self.log_fields: dict[str, str] = {"webhook": webhook_label(url)} if url else {}
        self._log = log.bind(**self.log_fields)
        self.user_agent = user_agent
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.offload_bytes = offload_bytes
        self._signer = Signer(secret) if secret is not None else None
        self._fixed_headers = {"Content-Type": "application/json", "User-Agent": user_agent}
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._random = random

    def headers_for(self, body: bytes, *, delivery_id: str) -> dict[str, str]:
        """The request headers of one attempt (signature computed now, over `body`)."""
        headers = {**self._fixed_headers, DELIVERY_ID_HEADER: delivery_id}
        if self._signer is not None:
            headers.update(self._signer.headers(int(self._wall_clock()), body))
        return headers

    def pause(self) -> Pause | None:
        """None unless the breaker is open; then the seconds until it lets a test attempt through."""
        breaker = self.breaker
        if breaker is None or breaker.state is not BreakerState.OPEN:
            return None
        return Pause(retry_in=breaker.retry_after(), reason=BREAKER_OPEN_REASON)

    async def attempt(self, body: bytes, *, delivery_id: str) -> Outcome:
        """One POST, judged; queue mode's workers make exactly one per delivery from the stream."""
        return outcome_of(await self.post(body, delivery_id=delivery_id), now=self._wall_clock())

    async def post(self, body: bytes, *, delivery_id: str) -> Attempt:
        """One POST with this attempt's headers (signed now, over `body`)."""
        if self._signer is not None and len(body) > self.offload_bytes:
            headers = await asyncio.to_thread(self.headers_for, body, delivery_id=delivery_id)
        else:
            headers = self.headers_for(body, delivery_id=delivery_id)
        return await self.transport.post(body, headers)

    def retry_wait(self, retry_number: int, attempt: Attempt) -> float:
        """Seconds before retry `retry_number` (1 for the first): the capped Retry-After, else jittered backoff."""
        return retry_wait(
            retry_number,
            retry_after=parse_retry_after(attempt.retry_after, now=self._wall_clock()),
            base=self.backoff_base,
            random=self._random,
        )

    async def deliver(self, body: bytes, *, delivery_id: str) -> DeliveryResult:
        attempts = 0
        while True:
            attempts += 1
            attempt = await self.post(body, delivery_id=delivery_id)
            verdict = judge(attempt)
            status = attempt.status
            if verdict is Verdict.CIRCUIT_OPEN:
                # The breaker refused the attempt without sending it: no retry can get through for now.
                self._log.warning("webhook_circuit_open", delivery_id=delivery_id, attempts=attempts)
                return DeliveryResult(
                    outcome=DeliveryOutcome.TEMPORARY_FAILURE,
                    attempts=attempts - 1,
                    reason=BREAKER_OPEN_REASON,
                    posted=attempts > 1,
                    circuit_open=True,
                )
            if verdict is Verdict.DELIVERED:
                if not info_dropped():
                    log.info("webhook_delivered", delivery_id=delivery_id, status=status, attempts=attempts)
                return DeliveryResult(
                    outcome=DeliveryOutcome.DELIVERED, attempts=attempts, status=status, reason="delivered"
                )
            if verdict is Verdict.REJECTED:
                self._log.warning("webhook_final_answer", delivery_id=delivery_id, status=status, attempts=attempts)
                return DeliveryResult(
                    outcome=DeliveryOutcome.REJECTED,
                    attempts=attempts,
                    status=status,
                    reason=f"Webhook refused the message (HTTP {status})",
                )
            if verdict is Verdict.UNEXPECTED:
                self._log.warning("webhook_final_answer", delivery_id=delivery_id, status=status, attempts=attempts)
                return DeliveryResult(
                    outcome=DeliveryOutcome.TEMPORARY_FAILURE,
                    attempts=attempts,
                    status=status,
                    reason=f"Webhook answered HTTP {status}, try again later",
                )
            problem = attempt.problem
            if attempts > self.max_retries:
                self._log.warning(
                    "webhook_retries_exhausted", delivery_id=delivery_id, problem=problem, attempts=attempts
                )
                return DeliveryResult(
                    outcome=DeliveryOutcome.TEMPORARY_FAILURE,
                    attempts=attempts,
                    status=status,
                    reason=f"Webhook delivery failed ({problem}), try again later",
                )
            wait = self.retry_wait(attempts, attempt)
            self._log.info(
                "webhook_retry_scheduled", delivery_id=delivery_id, problem=problem, attempt=attempts, wait=wait
            )
            await self._sleep(wait)
