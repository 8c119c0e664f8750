"""Relay.handle_envelope: parse, shape, breaker, deliver, and the DATA reply for each outcome."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence

import httpx
import pytest

from bastion_core import BreakerState, CircuitBreaker, Guard, ResilientTransport
from mailrelay._attachment_policy import AttachmentPolicy, PolicyAction
from mailrelay._attachments import Attachment, DeliveryMode
from mailrelay._delivery import BREAKER_OPEN_REASON, WebhookClient
from mailrelay._dmarc import DmarcPolicy, DmarcResult, DmarcVerdict
from mailrelay._errors import AttachmentStoreFailed
from mailrelay._parsing import MimePart
from mailrelay._relay import INLINE_WORK_LIMIT, Relay
from mailrelay.smtp import _replies as r
from mailrelay.smtp._session import Envelope, Session
from mailrelay.testing import FakeClock

MESSAGE = b"From: Al <al@example.org>\r\nSubject: hi\r\nX-Custom-A: 1\r\n\r\nhello\r\n"


def envelope(content: bytes = MESSAGE) -> Envelope:
    return Envelope(mail_from="al@example.org", recipients=["inbox@example.test", "ops@example.test"], content=content)


class Recorder:
    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.bodies: list[bytes] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(request.content)
        return httpx.Response(self.statuses.pop(0) if self.statuses else 200)


async def _no_sleep(seconds: float) -> None:
    return None


def make_relay(
    handler: Callable[[httpx.Request], httpx.Response], client_holder: list[httpx.AsyncClient], **kw: object
) -> Relay:
    breaker = kw.pop("breaker", None) or CircuitBreaker(min_requests=4, wait_secs=60, clock=FakeClock())
    assert isinstance(breaker, CircuitBreaker)
    # As in cli.py: the breaker sits under the webhook client, in its transport.
    transport = ResilientTransport(Guard(breaker=breaker), httpx.MockTransport(handler))
    client = httpx.AsyncClient(transport=transport)
    client_holder.append(client)
    policy = kw.pop("attachment_policy", None) or AttachmentPolicy(max_bytes=100)
    return Relay(
        webhook=WebhookClient(
            client=client, url="https://h.example/m", user_agent="UA", max_retries=1, sleep=_no_sleep
        ),
        breaker=breaker,
        attachment_policy=policy,  # type: ignore[arg-type]
        header_prefixes=("x-custom-",),
        new_delivery_id=lambda: "fixed-id",
        **kw,  # type: ignore[arg-type]
    )


async def test_delivered_message_gets_250_and_the_payload() -> None:
    recorder, clients = Recorder(), list[httpx.AsyncClient]()
    relay = make_relay(recorder, clients)
    reply = await relay.handle_envelope(envelope(), Session(peer_ip="127.0.0.1"))
    await clients[0].aclose()
    assert reply == r.MESSAGE_ACCEPTED
    assert json.loads(recorder.bodies[0]) == {
        "sender": "al@example.org",
        "sender_name": "Al",
        "recipient": "inbox@example.test",
        "subject": "hi",
        "body": "hello\n",
        "headers": {"X-Custom-A": "1"},
    }


async def test_retries_exhausted_gives_451_and_every_attempt_counts_for_the_breaker() -> None:
    breaker = CircuitBreaker(threshold=0.5, min_requests=4, wait_secs=60, clock=FakeClock())
    recorder, clients = Recorder(500, 500, 500, 500), list[httpx.AsyncClient]()
    relay = make_relay(recorder, clients, breaker=breaker)
    first = await relay.handle_envelope(envelope(), Session(peer_ip="x"))
    second = await relay.handle_envelope(envelope(), Session(peer_ip="x"))
    assert first == second == r.temporary_failure("Webhook delivery failed (HTTP 500), try again later")
    assert breaker.state is BreakerState.OPEN
    third = await relay.handle_envelope(envelope(), Session(peer_ip="x"))
    await clients[0].aclose()
    assert third == r.temporary_failure("Webhook temporarily unavailable (circuit open), try again later")
    assert len(recorder.bodies) == 4  # 2 messages x 2 attempts = 4 failures of 4; none for the third


async def test_4xx_gives_554_and_does_not_open_the_breaker() -> None:
    breaker = CircuitBreaker(min_requests=1, wait_secs=60, clock=FakeClock())
    recorder, clients = Recorder(422), list[httpx.AsyncClient]()
    reply = await make_relay(recorder, clients, breaker=breaker).handle_envelope(envelope(), Session(peer_ip="x"))
    await clients[0].aclose()
    assert reply == r.permanent_failure("Webhook refused the message (HTTP 422)")
    assert breaker.state is BreakerState.CLOSED


OVERSIZED = (
    b"Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\nx\r\n"
    b"--b\r\nContent-Type: application/octet-stream\r\n\r\n" + b"y" * 200 + b"\r\n--b--\r\n"
)


async def test_oversized_attachment_with_reject_gives_552_without_posting() -> None:
    recorder, clients = Recorder(), list[httpx.AsyncClient]()
    relay = make_relay(recorder, clients, attachment_policy=AttachmentPolicy(max_bytes=100, action=PolicyAction.REJECT))
    reply = await relay.handle_envelope(envelope(OVERSIZED), Session(peer_ip="x"))
    await clients[0].aclose()
    assert reply == r.ATTACHMENT_TOO_LARGE
    assert recorder.bodies == []


async def test_oversized_attachment_with_drop_is_left_out_and_counted() -> None:
    recorder, clients = Recorder(), list[httpx.AsyncClient]()
    relay = make_relay(recorder, clients)
    for _ in range(2):
        assert await relay.handle_envelope(envelope(OVERSIZED), Session(peer_ip="x")) == r.MESSAGE_ACCEPTED
    await clients[0].aclose()
    assert "attachments" not in json.loads(recorder.bodies[0])
    assert relay.dropped_attachments == {"max_bytes": 2}


class PassingDmarc:
    async def evaluate(self, *, raw: bytes, peer_ip: str, helo: str, mail_from: str) -> DmarcVerdict:
        return DmarcVerdict(result=DmarcResult.PASS, authenticated_from="al@example.org")


async def test_dmarc_seam_adds_its_fields() -> None:
    recorder, clients = Recorder(), list[httpx.AsyncClient]()
    relay = make_relay(recorder, clients, dmarc=PassingDmarc())
    await relay.handle_envelope(envelope(), Session(peer_ip="x"))
    await clients[0].aclose()
    payload = json.loads(recorder.bodies[0])
    assert (payload["dmarc_result"], payload["authenticated_from"]) == ("pass", "al@example.org")


@pytest.mark.parametrize("words", [pytest.param(6_000, id="30KiB-newsletter"), pytest.param(40_000, id="200KiB")])
async def test_big_messages_are_shaped_in_a_worker_thread_with_the_same_result(
    monkeypatch: pytest.MonkeyPatch, words: int
) -> None:
    """html2text needs ~1 ms per KiB: even a typical newsletter converted inline stalls every session."""
    offloaded: list[str] = []
    real_to_thread = asyncio.to_thread

    async def recording_to_thread(function: Callable[..., object], /, *args: object) -> object:
        offloaded.append(getattr(function, "func", function).__name__)
        return await real_to_thread(function, *args)

    monkeypatch.setattr("mailrelay._relay.asyncio.to_thread", recording_to_thread)
    html = "<p>" + "word " * words + "</p>"
    raw = f"Subject: big\r\nContent-Type: text/html\r\n\r\n{html}\r\n".encode()
    assert len(raw) > INLINE_WORK_LIMIT
    recorder, clients = Recorder(), list[httpx.AsyncClient]()
    reply = await make_relay(recorder, clients).handle_envelope(envelope(raw), Session(peer_ip="x"))
    await clients[0].aclose()
    assert reply == r.MESSAGE_ACCEPTED
    assert offloaded == ["parse_message", "build_payload"]
    payload = json.loads(recorder.bodies[0])
    assert payload["html_body"] == html + "\n"
    assert payload["body"].startswith("word word")


async def test_small_messages_are_shaped_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_threads(function: Callable[..., object], /, *args: object) -> object:
        raise AssertionError("a small message left the event loop")

    monkeypatch.setattr("mailrelay._relay.asyncio.to_thread", no_threads)
    recorder, clients = Recorder(), list[httpx.AsyncClient]()
    reply = await make_relay(recorder, clients).handle_envelope(envelope(), Session(peer_ip="x"))
    await clients[0].aclose()
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
async def test_dmarc_enforce_refuses_without_posting(verdict: DmarcVerdict, reply: r.Reply) -> None:
    recorder, clients = Recorder(), list[httpx.AsyncClient]()
    relay = make_relay(recorder, clients, dmarc=ScriptedDmarc(verdict), dmarc_enforce=True)
    assert await relay.handle_envelope(envelope(), Session(peer_ip="x")) == reply
    await clients[0].aclose()
    assert recorder.bodies == []


async def test_dmarc_monitor_posts_whatever_the_result() -> None:
    recorder, clients = Recorder(), list[httpx.AsyncClient]()
    relay = make_relay(recorder, clients, dmarc=ScriptedDmarc(REJECTING))
    assert await relay.handle_envelope(envelope(), Session(peer_ip="x")) == r.MESSAGE_ACCEPTED
    await clients[0].aclose()
    payload = json.loads(recorder.bodies[0])
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


async def test_attachment_store_failure_gives_451_without_posting() -> None:
    recorder, clients = Recorder(), list[httpx.AsyncClient]()
    relay = make_relay(recorder, clients, attachment_sink=RecordingSink(fail=True))
    assert await relay.handle_envelope(envelope(WITH_ATTACHMENT), Session(peer_ip="x")) == r.ATTACHMENT_STORE_FAILED
    await clients[0].aclose()
    assert recorder.bodies == []


async def test_open_circuit_answers_451_before_anything_is_stored() -> None:
    breaker = CircuitBreaker(min_requests=1, wait_secs=60, clock=FakeClock())
    breaker.record(breaker.admit(), success=False)
    sink, recorder, clients = RecordingSink(), Recorder(), list[httpx.AsyncClient]()
    relay = make_relay(recorder, clients, breaker=breaker, attachment_sink=sink)
    reply = await relay.handle_envelope(envelope(WITH_ATTACHMENT), Session(peer_ip="x"))
    await clients[0].aclose()
    assert reply == r.temporary_failure(BREAKER_OPEN_REASON)
    assert (sink.stored, sink.discarded, recorder.bodies) == ([], [], [])


async def test_circuit_refusing_the_first_attempt_discards_the_stored_attachments() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(min_requests=1, wait_secs=60, half_open_requests=1, clock=clock)
    breaker.record(breaker.admit(), success=False)
    clock.advance(60)
    breaker.admit()  # Half-Open: another message holds the one test slot
    sink, recorder, clients = RecordingSink(), Recorder(), list[httpx.AsyncClient]()
    relay = make_relay(recorder, clients, breaker=breaker, attachment_sink=sink)
    reply = await relay.handle_envelope(envelope(WITH_ATTACHMENT), Session(peer_ip="x"))
    await clients[0].aclose()
    assert reply == r.temporary_failure(BREAKER_OPEN_REASON)
    assert [a.url for a in sink.discarded] == ["s3://b/k"]
    assert recorder.bodies == []
