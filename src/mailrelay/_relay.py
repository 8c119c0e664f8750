"""The hand-off from SMTP to the webhook: parse, shape, check the breaker, deliver, answer DATA."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

import structlog

from mailrelay._attachments import AllowAll, AttachmentPolicy, AttachmentSink, InlineSink, check_sizes
from mailrelay._breaker import CircuitBreaker
from mailrelay._delivery import DeliveryOutcome, WebhookClient
from mailrelay._dmarc import DmarcEvaluator, DmarcVerdict
from mailrelay._errors import AttachmentTooLarge
from mailrelay._parsing import parse_message
from mailrelay._payload import build_payload
from mailrelay.smtp import _replies as r
from mailrelay.smtp._replies import Reply
from mailrelay.smtp._session import Envelope, Session

INLINE_WORK_LIMIT = 16 * 1024  # bytes of message; above it parsing and shaping run in a thread
# (html2text takes ~1 ms per KiB: 128 KiB inline stalled every other session for ~0.14 s)
BREAKER_OPEN_REASON = "Webhook temporarily unavailable (circuit open), try again later"

T = TypeVar("T")

log = structlog.get_logger("mailrelay.relay")


class Relay:
    """Implements EnvelopeHandler: one accepted message in, the final DATA reply out.

    The reply is known only after the webhook answered: 250 delivered, 451 temporary (retries
    exhausted or the breaker is open; the sending server keeps the message), 554 refused by the
    webhook, 552 attachment too large. The recipient in the payload is the first accepted one.
    """

    def __init__(
        self,
        *,
        webhook: WebhookClient,
        breaker: CircuitBreaker,
        max_attachment_size: int,
        header_prefixes: Sequence[str] = (),
        attachment_policy: AttachmentPolicy | None = None,
        attachment_sink: AttachmentSink | None = None,
        dmarc: DmarcEvaluator | None = None,
        new_delivery_id: Callable[[], str] = lambda: uuid.uuid4().hex,
    ) -> None:
        self.webhook = webhook
        self.breaker = breaker
        self.max_attachment_size = max_attachment_size
        self.header_prefixes = tuple(header_prefixes)
        self.attachment_policy: AttachmentPolicy = attachment_policy or AllowAll()
        self.attachment_sink: AttachmentSink = attachment_sink or InlineSink()
        self.dmarc = dmarc
        self._new_delivery_id = new_delivery_id

    @staticmethod
    async def _cpu_bound(size: int, function: Callable[..., T], *args: object) -> T:
        """Run parsing/shaping inline for small messages; big ones go to a worker thread, because
        html2text needs about 1 s per MB of HTML and the event loop serves every other session."""
        if size <= INLINE_WORK_LIMIT:
            return function(*args)
        return await asyncio.to_thread(function, *args)

    async def handle_envelope(self, envelope: Envelope, session: Session) -> Reply:
        delivery_id = self._new_delivery_id()
        bound = log.bind(delivery_id=delivery_id, peer=session.peer_ip)
        raw = envelope.content or b""
        try:
            message = await self._cpu_bound(len(raw), parse_message, raw)
            check_sizes(message.parts, limit=self.max_attachment_size)
        except AttachmentTooLarge as exc:
            bound.info("message_refused", reason="attachment_too_large", size=exc.size, limit=exc.limit)
            return r.ATTACHMENT_TOO_LARGE
        except Exception:
            bound.exception("message_unparsable")
            return r.MESSAGE_UNPARSABLE
        allowed = [part for part in message.parts if self.attachment_policy.allows(part)]
        attachments = [
            await self.attachment_sink.store(part, delivery_id=delivery_id, index=index)
            for index, part in enumerate(allowed)
        ]
        verdict: DmarcVerdict | None = None
        if self.dmarc is not None:
            verdict = await self.dmarc.evaluate(
                raw=raw, peer_ip=session.peer_ip, helo=session.helo or "", mail_from=envelope.mail_from or ""
            )
        payload = await self._cpu_bound(
            len(raw),
            functools.partial(
                build_payload,
                sender=envelope.mail_from or "",
                recipient=envelope.recipients[0] if envelope.recipients else "",
                message=message,
                header_prefixes=self.header_prefixes,
                attachments=attachments,
                dmarc=verdict,
            ),
        )
        body = payload.to_json()
        if not self.breaker.allow():
            bound.warning("message_deferred", reason="circuit_open", retry_in=round(self.breaker.retry_in(), 1))
            return r.temporary_failure(BREAKER_OPEN_REASON)
        try:
            result = await self.webhook.deliver(body, delivery_id=delivery_id)
        except asyncio.CancelledError:
            self.breaker.record_failure()  # unknown outcome: do not leave a half-open probe hanging
            raise
        except Exception:
            self.breaker.record_failure()
            raise
        if result.outcome is DeliveryOutcome.TEMPORARY_FAILURE:
            # only failed messages count: a 4xx refusal proves the receiver is up
            self.breaker.record_failure()
        else:
            self.breaker.record_success()
        bound.info(
            "message_relayed",
            outcome=result.outcome.value,
            attempts=result.attempts,
            status=result.status,
            size=len(raw),
            attachments=len(attachments),
        )
        if result.outcome is DeliveryOutcome.DELIVERED:
            return r.MESSAGE_ACCEPTED
        if result.outcome is DeliveryOutcome.REJECTED:
            return r.permanent_failure(result.reason)
        return r.temporary_failure(result.reason)
