"""Relay.handle_envelope: parse, shape, breaker, deliver or queue, and the DATA reply for each outcome.

The webhook is a real HTTP server (WebhookReceiver) behind the real transport and breaker, as in cli.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

import pytest

from bastion_core import BreakerState, CircuitBreaker, Guard
from mailrelay._attachment_policy import AttachmentPolicy, PolicyAction
from mailrelay._attachments import Attachment, DeliveryMode
from mailrelay._delivery import BREAKER_OPEN_REASON, WebhookClient
from mailrelay._dmarc import DmarcPolicy, DmarcResult, DmarcVerdict
from mailrelay._errors import AttachmentStoreFailed, QueueUnavailable
from mailrelay._parsing import MimePart
from mailrelay._processes import WorkerCrashed, WorkerProcesses
from mailrelay._relay import INLINE_WORK_LIMIT, PROCESS_WORK_LIMIT, Relay
from mailrelay._transport import AiohttpTransport
from mailrelay.smtp import _replies as r
from mailrelay.smtp._session import Envelope, Session
from mailrelay.testing import FakeClock, WebhookReceiver

MESSAGE = b"From: Al <al@example.org>\r\nSubject: hi\r\nX-Custom-A: 1\r\n\r\nhello\r\n"

MakeRelay = Callable[..., Relay]


def envelope(content: bytes = MESSAGE) -> Envelope:
    return Envelope(mail_from="al@example.org", recipients=["inbox@example.test", "ops@example.test"], content=content)


async def _no_sleep(seconds: float) -> None:
    return None


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as running:
        yield running


@pytest.fixture
async def make_relay(receiver: WebhookReceiver) -> AsyncIterator[MakeRelay]:
    """Factory: a Relay posting to `receiver` through the real transport, its breaker in the transport's guard."""
    transports: list[AiohttpTransport] = []

    def make(**kw: object) -> Relay:
        breaker = kw.pop("breaker", None) or CircuitBreaker(min_requests=4, wait_secs=60, clock=FakeClock())
        assert isinstance(breaker, CircuitBreaker)
        transport = AiohttpTransport.open(url=receiver.url, guard=Guard(breaker=breaker), timeout=5)
        transports.append(transport)
        policy = kw.pop("attachment_policy", None) or AttachmentPolicy(max_bytes=100)
        return Relay(
            target=WebhookClient(transport=transport, user_agent="UA", breaker=breaker, max_retries=1, sleep=_no_sleep),
            attachment_policy=policy,  # type: ignore[arg-type]
            header_prefixes=("x-custom-",),
            new_delivery_id=lambda: "fixed-id",
            **kw,  # type: ignore[arg-type]
        )

    yield make
    for transport in transports:
        await transport.close()


async def test_delivered_message_gets_250_and_the_payload(make_relay: MakeRelay, receiver: WebhookReceiver) -> None:
    relay = make_relay()
    reply = await relay.handle_envelope(envelope(), Session(peer_ip="127.0.0.1"))
    assert reply == r.MESSAGE_ACCEPTED
    assert json.loads(receiver.bodies()[0]) == {
        "sender": "al@example.org",
        "sender_name": "Al",
        "recipient": "inbox@example.test",
        "subject": "hi",
        "body": "hello\n",
        "headers": {"X-Custom-A": "1"},
    }


async def test_retries_exhausted_gives_451_and_every_attempt_counts_for_the_breaker(
    make_relay: MakeRelay, receiver: WebhookReceiver
) -> None:
    breaker = CircuitBreaker(threshold=0.5, min_requests=4, wait_secs=60, clock=FakeClock())
    receiver.script(500, 500, 500, 500)
    relay = make_relay(breaker=breaker)
    first = await relay.handle_envelope(envelope(), Session(peer_ip="x"))
    second = await relay.handle_envelope(envelope(), Session(peer_ip="x"))
    assert first == second == r.temporary_failure("Webhook delivery failed (HTTP 500), try again later")
    assert breaker.state is BreakerState.OPEN
    third = await relay.handle_envelope(envelope(), Session(peer_ip="x"))
    assert third == r.temporary_failure("Webhook temporarily unavailable (circuit open), try again later")
    assert len(receiver.bodies()) == 4  # 2 messages x 2 attempts = 4 failures of 4; none for the third


async def test_4xx_gives_554_and_does_not_open_the_breaker(make_relay: MakeRelay, receiver: WebhookReceiver) -> None:
    breaker = CircuitBreaker(min_requests=1, wait_secs=60, clock=FakeClock())
    receiver.script(422)
    reply = await make_relay(breaker=breaker).handle_envelope(envelope(), Session(peer_ip="x"))
    assert reply == r.permanent_failure("Webhook refused the message (HTTP 422)")
    assert breaker.state is BreakerState.CLOSED


OVERSIZED = (
    b"Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\nx\r\n"
    b"--b\r\nContent-Type: application/octet-stream\r\n\r\n" + b"y" * 200 + b"\r\n--b--\r\n"
)


async def test_oversized_attachment_with_reject_gives_552_without_posting(
    make_relay: MakeRelay, receiver: WebhookReceiver
) -> None:
    relay = make_relay(attachment_policy=AttachmentPolicy(max_bytes=100, action=PolicyAction.REJECT))
    reply = await relay.handle_envelope(envelope(OVERSIZED), Session(peer_ip="x"))
    assert reply == r.ATTACHMENT_TOO_LARGE
    assert receiver.bodies() == []


async def test_oversized_attachment_with_drop_is_left_out_and_counted(
    make_relay: MakeRelay, receiver: WebhookReceiver
) -> None:
    relay = make_relay()
    for _ in range(2):
        assert await relay.handle_envelope(envelope(OVERSIZED), Session(peer_ip="x")) == r.MESSAGE_ACCEPTED
    assert "attachments" not in json.loads(receiver.bodies()[0])
    assert relay.dropped_attachments == {"max_bytes": 2}


class PassingDmarc:
    async def evaluate(self, *, raw: bytes, peer_ip: str, helo: str, mail_from: str) -> DmarcVerdict:
        return DmarcVerdict(result=DmarcResult.PASS, authenticated_from="al@example.org")


async def test_dmarc_seam_adds_its_fields(make_relay: MakeRelay, receiver: WebhookReceiver) -> None:
    relay = make_relay(dmarc=PassingDmarc())
    await relay.handle_envelope(envelope(), Session(peer_ip="x"))
    payload = json.loads(receiver.bodies()[0])
    assert (payload["dmarc_result"], payload["authenticated_from"]) == ("pass", "al@example.org")


@pytest.mark.parametrize("words", [pytest.param(6_000, id="30KiB-newsletter"), pytest.param(40_000, id="200KiB")])
async def test_big_messages_are_shaped_in_a_worker_thread_with_the_same_result(
    make_relay: MakeRelay, receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch, words: int
) -> None:
    """html2text needs ~1 ms per KiB: even a typical newsletter converted inline stalls every session (no worker
    processes given here: every big message then goes to a thread)."""
    offloaded: list[str] = []
    real_to_thread = asyncio.to_thread

    async def recording_to_thread(function: Callable[..., object], /, *args: object) -> object:
        offloaded.append(getattr(function, "func", function).__name__)
        return await real_to_thread(function, *args)

    monkeypatch.setattr("mailrelay._relay.asyncio.to_thread", recording_to_thread)
    html = "<p>" + "word " * words + "</p>"
    raw = f"Subject: big\r\nContent-Type: text/html\r\n\r\n{html}\r\n".encode()
    assert len(raw) > INLINE_WORK_LIMIT
    reply = await make_relay().handle_envelope(envelope(raw), Session(peer_ip="x"))
    assert reply == r.MESSAGE_ACCEPTED
    assert offloaded == ["parse_message", "_payload_json"]
    payload = json.loads(receiver.bodies()[0])
    assert payload["html_body"] == html + "\n"
    assert payload["body"].startswith("word word")


async def test_small_messages_are_shaped_inline(
    make_relay: MakeRelay, receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_threads(function: Callable[..., object], /, *args: object) -> object:
        raise AssertionError("a small message left the event loop")

    monkeypatch.setattr("mailrelay._relay.asyncio.to_thread", no_threads)
    reply = await make_relay().handle_envelope(envelope(), Session(peer_ip="x"))
    assert reply == r.MESSAGE_ACCEPTED


class ScriptedDmarc:
    def __init__(self, verdict: DmarcVerdict) -> None:
        self.verdict = verdict

    async def evaluate(self, *, raw: bytes, peer_ip: str, helo: str, mail_from: str) -> DmarcVerdict:
        return self.verdict


REJECTING = DmarcVerdict(result=DmarcResult.FAIL, domain="example.org", policy=DmarcPolicy.REJECT)


@pytest.mark.parametrize(
    ("verdict", "reply"),
    [
        (REJECTING, r.dmarc_rejected("example.org")),
        (DmarcVerdict(result=DmarcResult.FAIL), r.DMARC_NO_AUTHOR),
        (DmarcVerdict(result=DmarcResult.TEMPERROR, domain="example.org"), r.DMARC_TEMPERROR),
    ],
)
async def test_dmarc_enforce_refuses_without_posting(
    make_relay: MakeRelay, receiver: WebhookReceiver, verdict: DmarcVerdict, reply: r.Reply
) -> None:
    relay = make_relay(dmarc=ScriptedDmarc(verdict), dmarc_enforce=True)
    assert await relay.handle_envelope(envelope(), Session(peer_ip="x")) == reply
    assert receiver.bodies() == []


async def test_dmarc_monitor_posts_whatever_the_result(make_relay: MakeRelay, receiver: WebhookReceiver) -> None:
    relay = make_relay(dmarc=ScriptedDmarc(REJECTING))
    assert await relay.handle_envelope(envelope(), Session(peer_ip="x")) == r.MESSAGE_ACCEPTED
    payload = json.loads(receiver.bodies()[0])
    assert (payload["dmarc_result"], "authenticated_from" in payload) == ("fail", False)


class RecordingSink:
    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.stored: list[MimePart] = []
        self.discarded: list[Attachment] = []

    async def store(self, parts: Sequence[MimePart], *, delivery_id: str) -> list[Attachment]:
        if self.fail:
            raise AttachmentStoreFailed("timeout")
        self.stored.extend(parts)
        return [
            Attachment(content_type=p.content_type, size_bytes=1, delivery=DeliveryMode.S3, url="s3://b/k")
            for p in parts
        ]

    async def discard(self, attachments: Sequence[Attachment]) -> None:
        self.discarded.extend(attachments)

    def close(self) -> None:
        return None


WITH_ATTACHMENT = (
    b"Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\nx\r\n"
    b"--b\r\nContent-Type: application/pdf\r\n\r\n%PDF\r\n--b--\r\n"
)


async def test_attachment_store_failure_gives_451_without_posting(
    make_relay: MakeRelay, receiver: WebhookReceiver
) -> None:
    relay = make_relay(attachment_sink=RecordingSink(fail=True))
    assert await relay.handle_envelope(envelope(WITH_ATTACHMENT), Session(peer_ip="x")) == r.ATTACHMENT_STORE_FAILED
    assert receiver.bodies() == []


async def test_open_circuit_answers_451_before_anything_is_stored(
    make_relay: MakeRelay, receiver: WebhookReceiver
) -> None:
    breaker = CircuitBreaker(min_requests=1, wait_secs=60, clock=FakeClock())
    breaker.record(breaker.admit(), success=False)
    sink = RecordingSink()
    relay = make_relay(breaker=breaker, attachment_sink=sink)
    reply = await relay.handle_envelope(envelope(WITH_ATTACHMENT), Session(peer_ip="x"))
    assert reply == r.temporary_failure(BREAKER_OPEN_REASON)
    assert (sink.stored, sink.discarded, receiver.bodies()) == ([], [], [])


async def test_circuit_refusing_the_first_attempt_discards_the_stored_attachments(
    make_relay: MakeRelay, receiver: WebhookReceiver
) -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(min_requests=1, wait_secs=60, half_open_requests=1, clock=clock)
    breaker.record(breaker.admit(), success=False)
    clock.advance(60)
    breaker.admit()  # Half-Open: another message holds the one test slot
    sink = RecordingSink()
    relay = make_relay(breaker=breaker, attachment_sink=sink)
    reply = await relay.handle_envelope(envelope(WITH_ATTACHMENT), Session(peer_ip="x"))
    assert reply == r.temporary_failure(BREAKER_OPEN_REASON)
    assert [a.url for a in sink.discarded] == ["s3://b/k"]
    assert receiver.bodies() == []


def _with_attachment_of(size: int) -> bytes:
    blob = b"QUFB" * (size // 4)
    return (
        b"Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\nsee file\r\n"
        b"--b\r\nContent-Type: application/octet-stream\r\nContent-Transfer-Encoding: base64\r\n"
        b'Content-Disposition: attachment; filename="a.bin"\r\n\r\n' + blob + b"\r\n--b--\r\n"
    )


async def test_big_messages_are_shaped_in_worker_processes_with_the_same_payload(
    make_relay: MakeRelay, receiver: WebhookReceiver
) -> None:
    """Past PROCESS_WORK_LIMIT parsing, base64 and JSON run in another process (their C calls hold the GIL)."""
    raw = _with_attachment_of(PROCESS_WORK_LIMIT)
    assert len(raw) > PROCESS_WORK_LIMIT
    processes = WorkerProcesses(workers=1)
    try:
        in_processes = make_relay(attachment_policy=AttachmentPolicy(max_bytes=10**7), processes=processes)
        assert await in_processes.handle_envelope(envelope(raw), Session(peer_ip="x")) == r.MESSAGE_ACCEPTED
    finally:
        processes.close()
    in_threads = make_relay(attachment_policy=AttachmentPolicy(max_bytes=10**7))
    assert await in_threads.handle_envelope(envelope(raw), Session(peer_ip="x")) == r.MESSAGE_ACCEPTED
    from_process, from_thread = receiver.bodies()
    assert from_process == from_thread
    assert json.loads(from_process)["attachments"][0]["size_bytes"] == PROCESS_WORK_LIMIT // 4 * 3


async def test_a_dead_worker_process_defers_the_message_instead_of_refusing_it(
    make_relay: MakeRelay, receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def crash(*args: object, **kwargs: object) -> object:
        raise WorkerCrashed("killed")

    processes = WorkerProcesses(workers=1)
    monkeypatch.setattr(processes, "run", crash)
    relay = make_relay(processes=processes)
    with pytest.raises(WorkerCrashed):  # the SMTP layer answers 451 Local error for it
        await relay.handle_envelope(envelope(_with_attachment_of(PROCESS_WORK_LIMIT)), Session(peer_ip="x"))
    assert receiver.bodies() == []


class MemoryQueue:
    """A MessageQueue that keeps what it is given (the real one, on JetStream, is tested in test_queue.py)."""

    def __init__(self, *, limit: int = 10**6, down: bool = False) -> None:
        self.limit = limit
        self.down = down
        self.stored: list[tuple[str, bytes]] = []

    def fits(self, size: int) -> bool:
        return size <= self.limit

    async def enqueue(self, body: bytes, *, delivery_id: str, route: str | None = None) -> None:
        if self.down:
            raise QueueUnavailable("not connected to NATS")
        self.stored.append((delivery_id, body))


async def test_queue_mode_answers_250_once_stored_and_posts_nothing(
    make_relay: MakeRelay, receiver: WebhookReceiver
) -> None:
    queue = MemoryQueue()
    assert await make_relay(queue=queue).handle_envelope(envelope(), Session(peer_ip="x")) == r.MESSAGE_ACCEPTED
    ((delivery_id, body),) = queue.stored
    assert delivery_id == "fixed-id"
    assert json.loads(body)["subject"] == "hi"
    assert receiver.bodies() == []


async def test_queue_mode_still_refuses_what_the_checks_refuse(
    make_relay: MakeRelay, receiver: WebhookReceiver
) -> None:
    queue = MemoryQueue()
    relay = make_relay(queue=queue, dmarc=ScriptedDmarc(REJECTING), dmarc_enforce=True)
    assert await relay.handle_envelope(envelope(), Session(peer_ip="x")) == r.dmarc_rejected("example.org")
    assert queue.stored == []


async def test_queue_unavailable_is_451_and_discards_the_stored_attachments(
    make_relay: MakeRelay, receiver: WebhookReceiver
) -> None:
    sink = RecordingSink()
    relay = make_relay(queue=MemoryQueue(down=True), attachment_sink=sink)
    assert await relay.handle_envelope(envelope(WITH_ATTACHMENT), Session(peer_ip="x")) == r.QUEUE_UNAVAILABLE
    assert str(r.QUEUE_UNAVAILABLE) == "451 4.3.0 Queue temporarily unavailable, try again later"
    assert [a.url for a in sink.discarded] == ["s3://b/k"]
    assert receiver.bodies() == []


async def test_open_circuit_does_not_defer_queued_mail(make_relay: MakeRelay, receiver: WebhookReceiver) -> None:
    breaker = CircuitBreaker(min_requests=1, wait_secs=60, clock=FakeClock())
    breaker.record(breaker.admit(), success=False)
    queue = MemoryQueue()
    relay = make_relay(breaker=breaker, queue=queue)
    assert await relay.handle_envelope(envelope(), Session(peer_ip="x")) == r.MESSAGE_ACCEPTED
    assert len(queue.stored) == 1


async def test_payload_too_big_for_the_queue_is_delivered_directly(
    make_relay: MakeRelay, receiver: WebhookReceiver
) -> None:
    queue = MemoryQueue(limit=10)
    assert await make_relay(queue=queue).handle_envelope(envelope(), Session(peer_ip="x")) == r.MESSAGE_ACCEPTED
    assert queue.stored == []
    assert json.loads(receiver.bodies()[0])["subject"] == "hi"
