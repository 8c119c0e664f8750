"""What a broker does with a handler's outcome, the same on NATS and on the in-memory test broker: the delay
before a failed message comes again, the dead letter's subject and headers, a responder's reply or error."""

from __future__ import annotations

from typing import Any

from bastion.broker._handlers import BrokerMessage, encode
from bastion.broker._specs import ConsumerSpec
from bastion.errors import BastionError, BrokerRequestFailed
from bastion_core import backoff_delay

ERROR_HEADER = "Bastion-Error"
"""On a reply: the responder failed (the value is its error code, the body ``{"error", "code"}``)."""
DEAD_LETTER_HEADERS = ("Bastion-Original-Subject", "Bastion-Deliveries", "Bastion-Error", "Bastion-Consumer")
MAX_RETRY_DELAY_SECS = 60.0
MAX_ERROR_CHARS = 500


def retry_delay(spec: ConsumerSpec, deliveries: int) -> float:
    """Seconds before a message that failed on delivery ``deliveries`` comes again: ``retry_delay`` doubled per
    delivery, at most 60 (no jitter)."""
    return backoff_delay(deliveries, base=spec.retry_delay, cap=MAX_RETRY_DELAY_SECS, random=lambda: 1.0)


def failure(exc: BaseException) -> str:
    """The handler's failure as the log and the dead letter's ``Bastion-Error`` header show it."""
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


def dead_letter_subject(spec: ConsumerSpec, prefix: str) -> str:
    """``spec.dead_letter_subject``, else ``<broker.dead_letter_prefix>.<durable>``."""
    return spec.dead_letter_subject or f"{prefix}.{spec.durable}"


def dead_letter_headers(spec: ConsumerSpec, message: BrokerMessage, error: str) -> dict[str, str]:
    """The dead letter's headers: original subject, deliveries, error, consumer (docs/broker.md)."""
    values = (message.subject, str(message.deliveries), error, spec.durable)
    return dict(zip(DEAD_LETTER_HEADERS, values, strict=True))


def reply_to(result: Any) -> tuple[bytes, dict[str, str]]:
    """A responder's return value as the reply's body and headers."""
    return encode(result if result is not None else b""), {}


def error_reply(exc: Exception) -> tuple[bytes, dict[str, str]]:
    """A responder's exception as the reply the requester turns into BrokerRequestFailed."""
    code = exc.code if isinstance(exc, BastionError) else "RESPONDER_ERROR"
    return encode({"error": str(exc), "code": code}), {ERROR_HEADER: code}


def failed_reply(reply: BrokerMessage) -> BrokerRequestFailed | None:
    """The error to raise for a reply that reports a responder's failure, else ``None``."""
    if ERROR_HEADER not in reply.headers:
        return None
    return BrokerRequestFailed(responder_error=reply.data.decode(errors="replace"))
