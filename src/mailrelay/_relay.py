"""The hand-off from SMTP to the delivery target: parse, check, shape, then deliver (direct mode) or queue (queue
mode), and answer DATA."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

import structlog

from bastion_core._logging import info_dropped
from bastion_core._random import uuid4_hex
from mailrelay._attachment_policy import AttachmentPolicy, Screened
from mailrelay._attachments import Attachment, AttachmentSink, InlineSink
from mailrelay._dmarc import DmarcEvaluator, DmarcVerdict, Enforcement, enforcement
from mailrelay._errors import AttachmentRejected, AttachmentStoreFailed, QueueUnavailable
from mailrelay._metrics import Delivery, RelayMetrics
from mailrelay._parsing import MimePart, ParsedMessage, parse_message, scrub
from mailrelay._payload import build_payload
from mailrelay._processes import WorkerCrashed, WorkerProcesses
from mailrelay._target import DeliveryOutcome, DeliveryResult, DeliveryTarget
from mailrelay.smtp import _replies as r
from mailrelay.smtp._replies import Reply
from mailrelay.smtp._session import Envelope, Session

INLINE_WORK_LIMIT = 16 * 1024  # bytes of message; above it parsing, shaping and JSON encoding leave the loop
# (html2text takes ~1 ms per KiB: 128 KiB inline stalled every other session for ~0.14 s)
PROCESS_WORK_LIMIT = 512 * 1024  # above it they go to a worker process: the GIL-holding C calls (MIME parsing,
# base64, JSON) of a 25 MB message held the loop for 50-200 ms at a time even from a thread
LOGGED_FILENAME_CHARS = 200

T = TypeVar("T")

log = structlog.get_logger("mailrelay.relay")


class MessageQueue(Protocol):
    """Where queue mode puts accepted payloads (`_queue.JetStreamQueue`); delivery workers take them from there.

    `fits(size)` says whether a payload of `size` bytes can be queued at all (the server's message size limit);
    `enqueue` returns once the queue has stored the payload durably, or raises QueueUnavailable.
    """

    def fits(self, size: int) -> bool: ...

    async def enqueue(self, body: bytes, *, delivery_id: str) -> None: ...


class Relay:
    """Implements EnvelopeHandler: one accepted message in, the final DATA reply out.

    Order: parse; the attachment policy (552/554 when its action is reject; dropped attachments are logged and
    counted); DMARC when an evaluator is set (with `dmarc_enforce`: 550 for a failing p=reject domain, 451 on
    temperror); the attachments' upload (451 when it fails); then the `target`. The reply is known only after the
    target answered: 250 delivered, 451 temporary (retries exhausted or the circuit is open; the sending server
    keeps the message), 554 refused by the target. The recipient in the payload is the first accepted one.
    While the target pauses (its breaker is open) the reply is 451 at once, before any work.

    With a `queue` (queue mode) every check above still comes first, then the payload is queued instead of
    posted: 250 once the queue stored it, 451 when the queue is unavailable; the breaker does not matter here
    (workers deliver later). A payload too large for the queue is delivered directly, as without a queue.

    With `metrics`, records the delivery outcomes (direct mode), DMARC results, attachments delivered, dropped and
    failed to store, and refused publishes (the SMTP layer counts the replies themselves).
    """

    def __init__(
        self,
        *,
        target: DeliveryTarget,
        attachment_policy: AttachmentPolicy,
        header_prefixes: Sequence[str] = (),
        attachment_sink: AttachmentSink | None = None,
        dmarc: DmarcEvaluator | None = None,
        dmarc_enforce: bool = False,
        queue: MessageQueue | None = None,
        processes: WorkerProcesses | None = None,
        metrics: RelayMetrics | None = None,
        new_delivery_id: Callable[[], str] = uuid4_hex,  # uuid4().hex without a getrandom call each
        random: Callable[[], float] = random.random,
    ) -> None:
        self.target = target
        self.attachment_policy = attachment_policy
        self.header_prefixes = tuple(header_prefixes)
        self.attachment_sink: AttachmentSink = attachment_sink or InlineSink()
        self.dmarc = dmarc
        self.dmarc_enforce = dmarc_enforce
        self.queue = queue
        self.processes = processes
        self.metrics = metrics
        self.dropped_attachments: collections.Counter[str] = collections.Counter()
        """Attachments the policy left out since start-up, by rule."""
        self._new_delivery_id = new_delivery_id
        self._random = random

    async def _cpu_bound(self, size: int, function: Callable[..., T], *args: object) -> T:
        """Run parsing/shaping inline for small messages, on a thread for bigger ones (html2text needs about 1 s
        per MB of HTML and the event loop serves every other session), on a worker process for big ones."""
        if size <= INLINE_WORK_LIMIT:
            return function(*args)
        if size <= PROCESS_WORK_LIMIT or self.processes is None:
            return await asyncio.to_thread(function, *args)
        return await self.processes.run(function, *args)

    async def handle_envelope(self, envelope: Envelope, session: Session) -> Reply:
        delivery_id = self._new_delivery_id()
        bound = log.bind(delivery_id=delivery_id, peer=session.peer_ip)
        paused = self._paused(bound)
        if paused is not None:
            return paused
        raw = envelope.content or b""
        try:
            message = await self._cpu_bound(len(raw), parse_message, raw)
        except WorkerCrashed:
            raise  # not the message's fault: 451, the sender tries again
        except Exception:
            bound.exception("message_unparsable")
            return r.MESSAGE_UNPARSABLE
        screened = self._screen(message, bound)
        if isinstance(screened, Reply):
            return screened
        verdict: DmarcVerdict | None = None
        if self.dmarc is not None:
            verdict = await self.dmarc.evaluate(
                raw=raw, peer_ip=session.peer_ip, helo=session.helo or "", mail_from=envelope.mail_from or ""
            )
            refusal = self._dmarc_refusal(verdict, bound)
            if refusal is not None:
                return refusal
        try:
            attachments = await self.attachment_sink.store(screened.kept, delivery_id=delivery_id)
        except AttachmentStoreFailed as exc:
            bound.warning("message_deferred", reason="attachment_store_failed", error=exc.reason)
            if self.metrics is not None:
                self.metrics.attachment_store_failed()
            return r.ATTACHMENT_STORE_FAILED
        if self.metrics is not None and attachments:
            self.metrics.attachments(attachments)
        body = await self._cpu_bound(
            len(raw),
            functools.partial(
                _payload_json,
                sender=envelope.mail_from or "",
                recipient=envelope.recipients[0] if envelope.recipients else "",
                message=dataclasses.replace(message, parts=()) if message.parts else message,  # attachments carry them
                header_prefixes=self.header_prefixes,
                attachments=attachments,
                dmarc=verdict,
            ),
        )
        details = {
            "size": len(raw),
            "attachments": len(attachments),
            "attachments_dropped": len(screened.dropped),
            "dmarc_result": verdict.result.value if verdict else None,
        }
        if self.queue is not None:
            if self.queue.fits(len(body)):
                return await self._enqueue(self.queue, body, delivery_id, attachments, bound, details)
            bound.info("message_too_large_for_queue", payload_size=len(body))
        return await self._deliver(body, delivery_id, attachments, bound, details)

    def _paused(self, bound: structlog.typing.FilteringBoundLogger) -> Reply | None:
        """Direct mode while the target pauses: nothing can be delivered for now, so say so (451) before parsing,
        checking or uploading anything."""
        pause = self.target.pause() if self.queue is None else None
        if pause is None:
            return None
        bound.warning("message_deferred", reason="circuit_open", retry_in=round(pause.retry_in, 1))
        if self.metrics is not None:
            self.metrics.delivery(Delivery.CIRCUIT_OPEN)
        return r.temporary_failure(pause.reason)

    def _screen(self, message: ParsedMessage, bound: structlog.typing.FilteringBoundLogger) -> Screened | Reply:
        """The attachment policy: what is kept and dropped (dropped ones logged and counted), or the refusal."""
        try:
            screened = self.attachment_policy.screen(message.parts)
        except AttachmentRejected as exc:
            bound.info(
                "message_refused",
                reason="attachment_policy",
                rule=exc.rule,
                filename=_shown_filename(exc.filename),
                content_type=scrub(exc.content_type),
                size=exc.size,
            )
            return r.ATTACHMENT_POLICY_REPLIES[exc.rule]
        self._log_dropped(screened, bound)
        return screened

    async def _deliver(
        self,
        body: bytes,
        delivery_id: str,
        attachments: Sequence[Attachment],
        bound: structlog.typing.FilteringBoundLogger,
        details: Mapping[str, object],
    ) -> Reply:
        """Direct mode: the target's delivery with its retries; the reply follows from how it ended."""
        result = await self.target.deliver(body, delivery_id=delivery_id)
        if not result.posted:
            await self.attachment_sink.discard(attachments)  # nothing was posted: no object is referenced
        if not info_dropped():
            bound.info(
                "message_relayed",
                outcome=result.outcome.value,
                attempts=result.attempts,
                status=result.status,
                **details,
            )
        if self.metrics is not None:
            self.metrics.delivery(_delivery(result))
        if result.outcome is DeliveryOutcome.DELIVERED:
            return r.MESSAGE_ACCEPTED
        if result.outcome is DeliveryOutcome.REJECTED:
            return r.permanent_failure(result.reason)
        return r.temporary_failure(result.reason)

    async def _enqueue(
        self,
        queue: MessageQueue,
        body: bytes,
        delivery_id: str,
        attachments: Sequence[Attachment],
        bound: structlog.typing.FilteringBoundLogger,
        details: Mapping[str, object],
    ) -> Reply:
        try:
            await queue.enqueue(body, delivery_id=delivery_id)
        except QueueUnavailable as exc:
            await self.attachment_sink.discard(attachments)  # nothing was queued: no object is referenced
            bound.warning("message_deferred", reason="queue_unavailable", error=exc.reason)
            if self.metrics is not None:
                self.metrics.queue_publish_failed()
            return r.QUEUE_UNAVAILABLE
        if not info_dropped():
            bound.info("message_queued", **details)
        return r.MESSAGE_ACCEPTED

    def _dmarc_refusal(self, verdict: DmarcVerdict, bound: structlog.typing.FilteringBoundLogger) -> Reply | None:
        """Counts the DMARC result; with `dmarc_enforce`, the reply refusing the message, if any (logged)."""
        if self.metrics is not None:
            self.metrics.dmarc(verdict.result)
        if not self.dmarc_enforce:
            return None
        refusal = self._enforced(verdict)
        if refusal is not None:
            bound.info("message_refused", reason="dmarc", dmarc_result=verdict.result.value, reply=refusal.code)
        return refusal

    def _enforced(self, verdict: DmarcVerdict) -> Reply | None:
        decision = enforcement(verdict, sample=self._random())
        if decision is Enforcement.DEFER:
            return r.DMARC_TEMPERROR
        if decision is Enforcement.REJECT:
            return r.dmarc_rejected(verdict.domain) if verdict.domain else r.DMARC_NO_AUTHOR
        return None

    def _log_dropped(self, screened: Screened, bound: structlog.typing.FilteringBoundLogger) -> None:
        for dropped in screened.dropped:
            rule = dropped.rule.value
            self.dropped_attachments[rule] += 1
            if self.metrics is not None:
                self.metrics.attachment_dropped(dropped.rule)
            part: MimePart = dropped.part
            bound.info(
                "attachment_dropped",
                rule=rule,
                filename=_shown_filename(part.filename),
                content_type=scrub(part.content_type),
                size=len(part.data),
                dropped_total=self.dropped_attachments[rule],
            )


def _delivery(result: DeliveryResult) -> Delivery:
    if result.outcome is DeliveryOutcome.DELIVERED:
        return Delivery.DELIVERED
    if result.outcome is DeliveryOutcome.REJECTED:
        return Delivery.REFUSED
    return Delivery.CIRCUIT_OPEN if result.circuit_open else Delivery.FAILED


def _payload_json(
    *,
    sender: str,
    recipient: str,
    message: ParsedMessage,
    header_prefixes: Sequence[str],
    attachments: Sequence[Attachment],
    dmarc: DmarcVerdict | None,
) -> bytes:
    """The exact bytes posted (and signed): shaping and JSON encoding in one step, so both leave the loop together."""
    return build_payload(
        sender=sender,
        recipient=recipient,
        message=message,
        header_prefixes=header_prefixes,
        attachments=attachments,
        dmarc=dmarc,
    ).to_json()


def _shown_filename(filename: str | None) -> str | None:
    """A file name as logged: control characters escaped, at most LOGGED_FILENAME_CHARS characters."""
    if filename is None:
        return None
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in scrub(filename))
    return shown[:LOGGED_FILENAME_CHARS]
