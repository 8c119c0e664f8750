"""The delivery seam: Relay and the queue workers work with any DeliveryTarget, here one that is not a webhook.

What the target says (its verdicts, its pause, its reply text) decides the DATA reply and the queue's ack, retry
or dead letter; no HTTP status and no breaker is read outside the target.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from mailrelay._attachment_policy import AttachmentPolicy
from mailrelay._metrics import RelayMetrics
from mailrelay._queue import QueuedMessage
from mailrelay._redelivery import RedeliveryRules
from mailrelay._relay import Relay
from mailrelay._target import DeliveryOutcome, DeliveryResult, DeliveryTarget, Outcome, Pause, Verdict
from mailrelay._workers import DeliveryWorkers
from mailrelay.smtp import _replies as r
from mailrelay.smtp._session import Envelope, Session
from tests.mailrelay.scrape import samples

MESSAGE = b"From: al@example.org\r\nSubject: hi\r\n\r\nhello\r\n"


@dataclass
class MailboxTarget:
    """A target that is not a webhook: it files payloads, answers with the verdict it is given, pauses on demand."""

    verdict: Verdict = Verdict.DELIVERED
    paused: Pause | None = None
    filed: list[tuple[str, bytes]] = field(default_factory=list)

    @property
    def log_fields(self) -> Mapping[str, str]:
        return {"mailbox": "test"}

    def pause(self) -> Pause | None:
        return self.paused

    async def deliver(self, body: bytes, *, delivery_id: str) -> DeliveryResult:
        self.filed.append((delivery_id, body))
        if self.verdict is Verdict.DELIVERED:
            return DeliveryResult(outcome=DeliveryOutcome.DELIVERED, attempts=1, reason="filed")
        return DeliveryResult(outcome=DeliveryOutcome.REJECTED, attempts=1, reason="Mailbox refused it")

    async def attempt(self, body: bytes, *, delivery_id: str) -> Outcome:
        self.filed.append((delivery_id, body))
        return Outcome(verdict=self.verdict, problem="mailbox full", retry_after=7.0)


def relay_to(target: DeliveryTarget, metrics: RelayMetrics | None = None) -> Relay:
    return Relay(target=target, attachment_policy=AttachmentPolicy(max_bytes=1000), metrics=metrics)


def envelope() -> Envelope:
    return Envelope(mail_from="al@example.org", recipients=["inbox@example.test"], content=MESSAGE)


async def test_the_relay_delivers_to_any_target() -> None:
    target = MailboxTarget()
    assert await relay_to(target).handle_envelope(envelope(), Session(peer_ip="x")) == r.MESSAGE_ACCEPTED
    ((_, body),) = target.filed
    assert json.loads(body)["sender"] == "al@example.org"


async def test_a_final_refusal_of_the_target_is_554_with_its_reason() -> None:
    target = MailboxTarget(verdict=Verdict.REJECTED)
    reply = await relay_to(target).handle_envelope(envelope(), Session(peer_ip="x"))
    assert reply == r.permanent_failure("Mailbox refused it")


async def test_a_paused_target_gets_nothing_and_the_sender_its_451() -> None:
    target = MailboxTarget(paused=Pause(retry_in=12.0, reason="Mailbox paused, try again later"))
    metrics = RelayMetrics(process_collector=False)
    reply = await relay_to(target, metrics).handle_envelope(envelope(), Session(peer_ip="x"))
    assert (reply, target.filed) == (r.temporary_failure("Mailbox paused, try again later"), [])
    counted = samples(metrics.exposition().decode(), "mailrelay_deliveries_total")
    assert counted['mailrelay_deliveries_total{outcome="circuit_open",target="webhook"}'] == 1.0


class FakeMsg:
    """The acknowledgements of one queued delivery, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float | None]] = []

    async def ack(self) -> None:
        self.calls.append(("ack", None))

    async def nak(self, delay: float) -> None:
        self.calls.append(("nak", delay))


class FakeInbox:
    def __init__(self) -> None:
        self.dead: list[tuple[str, str]] = []

    async def fetch(self, batch: int, *, wait: float) -> list[QueuedMessage]:
        return []

    async def dead_letter(self, message: QueuedMessage, *, error: str, attempts: int) -> None:
        self.dead.append((message.delivery_id, error))


@pytest.mark.parametrize(
    ("verdict", "calls", "dead"),
    [
        pytest.param(Verdict.DELIVERED, [("ack", None)], [], id="delivered-acked"),
        pytest.param(Verdict.RETRY, [("nak", 7.0)], [], id="retry-after-the-targets-wait"),
        pytest.param(Verdict.REJECTED, [("ack", None)], [("d1", "mailbox full")], id="rejected-dead-lettered"),
    ],
)
async def test_the_workers_act_on_the_targets_verdict(
    verdict: Verdict, calls: list[tuple[str, float | None]], dead: list[tuple[str, str]]
) -> None:
    inbox, msg = FakeInbox(), FakeMsg()
    workers = DeliveryWorkers(
        inbox=inbox,
        target=MailboxTarget(verdict=verdict),
        rules=RedeliveryRules(max_attempts=5, max_age=3600, backoff_base=1.0),
        concurrency=1,
        wall_clock=lambda: 1000.0,
    )
    message = QueuedMessage(body=b"{}", delivery_id="d1", number=1, accepted_at=990.0, _msg=msg)  # type: ignore[arg-type]
    await workers.deliver(message)
    assert (msg.calls, inbox.dead) == (calls, dead)
