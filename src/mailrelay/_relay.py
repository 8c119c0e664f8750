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

from bastion_core._logging import LazyBound, info_dropped
from bastion_core._random import uuid4_hex
from mailrelay._attachment_policy import AttachmentPolicy, Screened
from mailrelay._attachments import Attachment, AttachmentSink, InlineSink
from mailrelay._dmarc import DmarcEvaluator, DmarcVerdict, Enforcement, enforcement
from mailrelay._errors import AttachmentRejected, AttachmentStoreFailed, QueueUnavailable
from mailrelay._metrics import Delivery, RelayMetrics
from mailrelay._parsing import MimePart, ParsedMessage, parse_message, scrub
from mailrelay._payload import build_payload, encode_json
from mailrelay._payload_v2 import Transaction, payload_v2_dict
from mailrelay._processes import WorkerCrashed, WorkerProcesses
from mailrelay._raw import RawMessage, RawStore
from mailrelay._routing import DEFAULT_ROUTE, target_label
from mailrelay._sender_rules import MessageFacts
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
Stored = tuple[list[Attachment], RawMessage | None]
"""What a message has stored for its payload: the attachment entries and the original message's reference."""

log = structlog.get_logger("mailrelay.relay")


class MessageQueue(Protocol):
    """Where queue mode puts accepted payloads (`_queue.JetStreamQueue`); delivery workers take them from there.

    `fits(size)` says whether a payload of `size` bytes can be queued at all (the server's message size limit);
    `enqueue` returns once the queue has stored the payload durably, or raises QueueUnavailable.
    """

    def fits(self, size: int) -> bool: ...

    async def enqueue(self, body: bytes, *, delivery_id: str, route: str | None = None) -> None: ...


class SenderPolicy(Protocol):
    """The sender rules (`_sender_rules.SenderRules`): whether the message's route receives it."""

    def decide(self, facts: MessageFacts) -> SenderDecision: ...


class SenderDecision(Protocol):
    @property
    def allowed(self) -> bool: ...

    @property
    def reasons(self) -> tuple[str, ...]: ...

    @property
    def errors(self) -> tuple[str, ...]: ...


class Relay:
    """Implements EnvelopeHandler: one accepted message in, the final DATA reply out.

    Order: parse; the attachment policy (552/554 when its action is reject; dropped attachments are logged and
    counted); DMARC when an evaluator is set (with `dmarc_enforce`: 550 for a failing p=reject domain, 451 on
    temperror); the attachments' upload (451 when it fails); the original message's (`raw_store`, MAIL_RELAY_RAW:
    451 when its upload fails); then the `target`. The reply is known only after the
    target answered: 250 delivered, 451 temporary (retries exhausted or the circuit is open; the sending server
    keeps the message), 554 refused by the target. The recipient in the payload is the first accepted one.
    Each transaction has one route (`envelope.route`, set by the SMTP layer): its target from `route_targets` (by
    route name; `target` for the default route and any other). A `sender_policy` decides after DMARC: a Deny (or an
    evaluation error) answers `550 5.7.1 <sender_policy_deny_text>`.
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
        route_targets: Mapping[str, DeliveryTarget] | None = None,
        sender_policy: SenderPolicy | None = None,
        sender_policy_deny_text: str = r.DEFAULT_SENDER_POLICY_TEXT,
        header_prefixes: Sequence[str] = (),
        attachment_sink: AttachmentSink | None = None,
        dmarc: DmarcEvaluator | None = None,
        dmarc_enforce: bool = False,
        queue: MessageQueue | None = None,
        raw_store: RawStore | None = None,
        processes: WorkerProcesses | None = None,
        metrics: RelayMetrics | None = None,
        payload_version: int = 1,
        new_delivery_id: Callable[[], str] = uuid4_hex,  # uuid4().hex without a getrandom call each
        random: Callable[[], float] = random.random,
    ) -> None:
        self.target = target
        self.route_targets = dict(route_targets or {})
        self.sender_policy = sender_policy
        self.sender_denied = r.sender_policy_denied(sender_policy_deny_text)
        self.attachment_policy = attachment_policy
        self.header_prefixes = tuple(header_prefixes)
        self.attachment_sink: AttachmentSink = attachment_sink or InlineSink()
        self.dmarc = dmarc
        self.dmarc_enforce = dmarc_enforce
        self.queue = queue
        self.raw_store = raw_store
        self.processes = processes
        self.metrics = metrics
        self.payload_version = payload_version
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
        bound = LazyBound(log, delivery_id=delivery_id, peer=session.peer_ip)
        route = envelope.route.name if envelope.route is not None else None
        target = self.route_targets.get(route or "", self.target)
        if route is not None and self.route_targets:
            bound = bound.bind(route=route)
        label = target_label(route)
        paused = self._paused(target, label, bound)
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
        if self.sender_policy is not None:
            facts = MessageFacts(
                sender=envelope.mail_from or "",
                route=route or DEFAULT_ROUTE,
                client_ip=session.peer_ip,
                helo=session.helo or "",
                size=len(raw),
                attachment_types=[part.content_type for part in screened.kept],
                verdict=verdict,
            )
            if not self._sender_allowed(self.sender_policy, facts, bound):
                return self.sender_denied
        stored = await self._store(screened, raw, delivery_id, bound)
        if isinstance(stored, Reply):
            return stored
        attachments, raw_message = stored
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
                transaction=_transaction(envelope, session, len(raw)) if self._version(envelope) == 2 else None,
                raw=raw_message,
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
                return await self._enqueue(
                    self.queue, body, delivery_id, route, (attachments, raw_message), bound, details
                )
            bound.info("message_too_large_for_queue", payload_size=len(body))
        return await self._deliver(target, label, body, delivery_id, (attachments, raw_message), bound, details)

    def _version(self, envelope: Envelope) -> int:
        """The payload version: the route's (routes file) when it sets one, else MAIL_RELAY_PAYLOAD_VERSION."""
        route = envelope.route
        if route is not None and route.payload_version is not None:
            return route.payload_version
        return self.payload_version

    async def _store(self, screened: Screened, raw: bytes, delivery_id: str, bound: LazyBound) -> Stored | Reply:
        """The kept attachments through the sink, then the original message through the raw store (both 451 when
        an upload fails; then nothing of the message stays stored)."""
        try:
            attachments = await self.attachment_sink.store(screened.kept, delivery_id=delivery_id)
        except AttachmentStoreFailed as exc:
            bound.warning("message_deferred", reason="attachment_store_failed", error=exc.reason)
            if self.metrics is not None:
                self.metrics.attachment_store_failed()
            return r.ATTACHMENT_STORE_FAILED
        raw_message: RawMessage | None = None
        if self.raw_store is not None:
            try:
                raw_message = await self.raw_store.store(raw, delivery_id=delivery_id)
            except AttachmentStoreFailed as exc:
                await self.attachment_sink.discard(attachments)
                bound.warning("message_deferred", reason="raw_store_failed", error=exc.reason)
                if self.metrics is not None:
                    self.metrics.attachment_store_failed()
                return r.RAW_STORE_FAILED
            if raw_message is None:
                bound.info("raw_message_not_inlined", size=len(raw))
        if self.metrics is not None and attachments:
            self.metrics.attachments(attachments)
        return attachments, raw_message

    async def _discard(self, stored: Stored) -> None:
        """Nothing was posted or queued: no stored object is referenced."""
        attachments, raw_message = stored
        await self.attachment_sink.discard(attachments)
        if raw_message is not None and self.raw_store is not None:
            await self.raw_store.discard(raw_message)

    def _sender_allowed(self, policy: SenderPolicy, facts: MessageFacts, bound: LazyBound) -> bool:
        """The sender policy's decision, logged when it refuses (an evaluation error refuses: fail closed)."""
        decision = policy.decide(facts)
        if not decision.allowed:
            bound.info(
                "message_refused",
                reason="sender_policy",
                policies=list(decision.reasons),
                errors=list(decision.errors),
                reply=550,
            )
            if self.metrics is not None:
                self.metrics.sender_policy_denied()
        return decision.allowed

    def _paused(self, target: DeliveryTarget, label: str, bound: LazyBound) -> Reply | None:
        """Direct mode while the target pauses: nothing can be delivered for now, so say so (451) before parsing,
        checking or uploading anything."""
        pause = target.pause() if self.queue is None else None
        if pause is None:
            return None
        bound.warning("message_deferred", reason="circuit_open", retry_in=round(pause.retry_in, 1))
        if self.metrics is not None:
            self.metrics.delivery(Delivery.CIRCUIT_OPEN, target=label)
        return r.temporary_failure(pause.reason)

    def _screen(self, message: ParsedMessage, bound: LazyBound) -> Screened | Reply:
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
        target: DeliveryTarget,
        label: str,
        body: bytes,
        delivery_id: str,
        stored: Stored,
        bound: LazyBound,
        details: Mapping[str, object],
    ) -> Reply:
        """Direct mode: the target's delivery with its retries; the reply follows from how it ended."""
        result = await target.deliver(body, delivery_id=delivery_id)
        if not result.posted:
            await self._discard(stored)
        if not info_dropped():
            bound.info(
                "message_relayed",
                outcome=result.outcome.value,
                attempts=result.attempts,
                status=result.status,
                **details,
            )
        if self.metrics is not None:
            self.metrics.delivery(_delivery(result), target=label)
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
        route: str | None,
        stored: Stored,
        bound: LazyBound,
        details: Mapping[str, object],
    ) -> Reply:
        try:
            await queue.enqueue(body, delivery_id=delivery_id, route=route)
        except QueueUnavailable as exc:
            await self._discard(stored)
            bound.warning("message_deferred", reason="queue_unavailable", error=exc.reason)
            if self.metrics is not None:
                self.metrics.queue_publish_failed()
            return r.QUEUE_UNAVAILABLE
        if not info_dropped():
            bound.info("message_queued", **details)
        return r.MESSAGE_ACCEPTED

    def _dmarc_refusal(self, verdict: DmarcVerdict, bound: LazyBound) -> Reply | None:
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

    def _log_dropped(self, screened: Screened, bound: LazyBound) -> None:
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
    transaction: Transaction | None = None,
    raw: RawMessage | None,
) -> bytes:
    """The exact bytes posted (and signed): shaping and JSON encoding in one step, so both leave the loop together.
    With a `transaction`, payload v2."""
    payload = build_payload(
        sender=sender,
        recipient=recipient,
        message=message,
        header_prefixes=header_prefixes,
        attachments=attachments,
        dmarc=dmarc,
        raw=raw,
    )
    if transaction is None:
        return payload.to_json()
    if dmarc is None:
        return encode_json(payload_v2_dict(payload, message, transaction))
    return encode_json(payload_v2_dict(payload, message, transaction, spf=dmarc.spf, dkim=dmarc.dkim))


def _transaction(envelope: Envelope, session: Session, size: int) -> Transaction:
    return Transaction(tuple(envelope.recipients), session.peer_ip, session.helo, size)


def _shown_filename(filename: str | None) -> str | None:
    """A file name as logged: control characters escaped, at most LOGGED_FILENAME_CHARS characters."""
    if filename is None:
        return None
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in scrub(filename))
    return shown[:LOGGED_FILENAME_CHARS]
