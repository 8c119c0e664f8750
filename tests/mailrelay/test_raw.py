"""MAIL_RELAY_RAW: the original message inline under its cap, or as an .eml object in S3 (a real moto server), and
how the relay stores, references and discards it."""

from __future__ import annotations

import base64
import datetime
import json
import re
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest

from bastion_core import CircuitBreaker, Guard
from mailrelay._attachment_policy import AttachmentPolicy
from mailrelay._delivery import WebhookClient
from mailrelay._errors import AttachmentStoreFailed, QueueUnavailable
from mailrelay._payload import WebhookPayload
from mailrelay._raw import InlineRaw, RawMessage, S3Raw
from mailrelay._relay import Relay
from mailrelay._s3 import S3Sink, make_client
from mailrelay._transport import AiohttpTransport
from mailrelay.smtp import _replies as r
from mailrelay.smtp._session import Envelope, Session
from mailrelay.testing import FakeClock, WebhookReceiver
from tests.mailrelay.servers import S3_REGION, S3Server

UUID = "0c8f3a52-2b4e-4d6f-9b1a-5f0e6c7d8e9f"
NOON = datetime.datetime(2026, 3, 4, 12, 0, tzinfo=datetime.UTC).timestamp()
MESSAGE = b"From: Al <al@example.org>\r\nSubject: hi\r\nMessage-ID: <1@example.org>\r\n\r\nhello\r\n"


class TestPayloadFields:
    def test_inline_reference_is_base64_of_the_exact_bytes(self) -> None:
        assert RawMessage(data=b"\x00\xffhi\r\n").fields() == {"raw_base64": "AP9oaQ0K"}

    def test_s3_reference_has_the_url_and_the_presigned_url_when_set(self) -> None:
        assert RawMessage(url="s3://b/k.eml", presigned_url="https://x/k.eml?sig").fields() == {
            "raw_url": "s3://b/k.eml",
            "raw_presigned_url": "https://x/k.eml?sig",
        }
        assert RawMessage(url="s3://b/k.eml").fields() == {"raw_url": "s3://b/k.eml"}

    def test_raw_fields_come_last_and_are_omitted_without_raw(self) -> None:
        base = {"sender": "a@x", "recipient": "b@y", "subject": "s", "body": "t", "dmarc_result": "pass"}
        without = WebhookPayload(**base)  # type: ignore[arg-type]
        assert list(json.loads(without.to_json())) == ["sender", "recipient", "subject", "body", "dmarc_result"]
        with_raw = WebhookPayload(**base, raw=RawMessage(url="s3://b/k"))  # type: ignore[arg-type]
        assert list(json.loads(with_raw.to_json()))[-2:] == ["dmarc_result", "raw_url"]


async def test_inline_keeps_messages_up_to_the_cap_and_nothing_above() -> None:
    store = InlineRaw(max_bytes=len(MESSAGE))
    assert await store.store(MESSAGE, delivery_id="d") == RawMessage(data=MESSAGE)
    assert await store.store(MESSAGE + b"!", delivery_id="d") is None


@pytest.fixture
def bucket(s3_server: S3Server, request: pytest.FixtureRequest) -> str:
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-") + "-r"
    s3_server.client().create_bucket(Bucket=name)
    return name


def s3_raw(server: S3Server, bucket: str, **options: object) -> S3Raw:
    client = make_client(endpoint_url=server.url, region=S3_REGION, timeout=5.0)
    return S3Raw(
        S3Sink(client=client, bucket=bucket, prefix="mail/", clock=lambda: NOON, new_id=lambda: UUID, **options)  # type: ignore[arg-type]
    )


@pytest.mark.usefixtures("aws_credentials")
async def test_s3_stores_the_exact_message_as_an_eml_object(s3_server: S3Server, bucket: str) -> None:
    store = s3_raw(s3_server, bucket, presign_secs=300, inline_max_bytes=1_000_000)  # raw never stays inline
    reference = await store.store(MESSAGE, delivery_id="d1")
    key = f"mail/2026/03/04/{UUID}-message.eml"
    assert reference.url == f"s3://{bucket}/{key}"
    stored = s3_server.client().get_object(Bucket=bucket, Key=key)
    assert (stored["Body"].read(), stored["ContentType"], stored["Metadata"]) == (
        MESSAGE,
        "message/rfc822",
        {"delivery-id": "d1"},
    )
    assert stored["ContentDisposition"] == "attachment; filename=\"message.eml\"; filename*=UTF-8''message.eml"
    assert reference.presigned_url is not None
    assert dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(reference.presigned_url).query))["X-Amz-Expires"] == "300"
    async with httpx.AsyncClient(timeout=10) as http:  # a plain GET, no credentials
        assert (await http.get(reference.presigned_url)).content == MESSAGE
    store.sink.close()


@pytest.mark.usefixtures("aws_credentials")
async def test_s3_discard_deletes_the_object(s3_server: S3Server, bucket: str) -> None:
    store = s3_raw(s3_server, bucket)
    reference = await store.store(MESSAGE, delivery_id="d1")
    await store.discard(reference)
    assert s3_server.client().list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    store.sink.close()


@pytest.mark.usefixtures("aws_credentials")
async def test_s3_missing_bucket_fails_the_store(s3_server: S3Server) -> None:
    store = s3_raw(s3_server, "no-such-bucket-raw")
    with pytest.raises(AttachmentStoreFailed, match="S3 error NoSuchBucket"):
        await store.store(MESSAGE, delivery_id="d1")
    store.sink.close()


class RecordingRaw:
    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.discarded: list[RawMessage] = []

    async def store(self, raw: bytes, *, delivery_id: str) -> RawMessage:
        if self.fail:
            raise AttachmentStoreFailed("timeout")
        return RawMessage(url=f"s3://b/{delivery_id}.eml")

    async def discard(self, reference: RawMessage) -> None:
        self.discarded.append(reference)


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as running:
        yield running


@pytest.fixture
async def make_relay(receiver: WebhookReceiver) -> AsyncIterator[Callable[..., Relay]]:
    transports: list[AiohttpTransport] = []

    def make(raw_store: object, **kw: object) -> Relay:
        breaker = CircuitBreaker(min_requests=4, wait_secs=60, clock=FakeClock())
        transport = AiohttpTransport.open(url=receiver.url, guard=Guard(breaker=breaker), timeout=5)
        transports.append(transport)
        return Relay(
            target=WebhookClient(transport=transport, user_agent="UA", breaker=breaker, max_retries=0),
            attachment_policy=AttachmentPolicy(max_bytes=100),
            raw_store=raw_store,  # type: ignore[arg-type]
            new_delivery_id=lambda: "fixed-id",
            **kw,  # type: ignore[arg-type]
        )

    yield make
    for transport in transports:
        await transport.close()


def envelope() -> Envelope:
    return Envelope(mail_from="al@example.org", recipients=["inbox@example.test"], content=MESSAGE)


async def test_relay_posts_the_inline_message_last_in_the_payload(
    make_relay: Callable[..., Relay], receiver: WebhookReceiver
) -> None:
    relay = make_relay(InlineRaw())
    assert await relay.handle_envelope(envelope(), Session(peer_ip="x")) == r.MESSAGE_ACCEPTED
    (body,) = receiver.bodies()
    payload = json.loads(body)
    assert list(payload)[-1] == "raw_base64"
    assert base64.b64decode(payload["raw_base64"]) == MESSAGE


async def test_relay_without_raw_sends_no_raw_field(
    make_relay: Callable[..., Relay], receiver: WebhookReceiver
) -> None:
    relay = make_relay(InlineRaw(max_bytes=10))  # over the cap: delivered without it
    assert await relay.handle_envelope(envelope(), Session(peer_ip="x")) == r.MESSAGE_ACCEPTED
    (body,) = receiver.bodies()
    assert not {"raw_base64", "raw_url", "raw_presigned_url"} & set(json.loads(body))


async def test_raw_store_failure_is_451_without_posting(
    make_relay: Callable[..., Relay], receiver: WebhookReceiver
) -> None:
    relay = make_relay(RecordingRaw(fail=True))
    assert await relay.handle_envelope(envelope(), Session(peer_ip="x")) == r.RAW_STORE_FAILED
    assert r.RAW_STORE_FAILED.line() == b"451 4.3.0 Message storage unavailable, try again later\r\n"
    assert receiver.bodies() == []


class DownQueue:
    def fits(self, size: int) -> bool:
        return True

    async def enqueue(self, body: bytes, *, delivery_id: str, route: str | None = None) -> None:
        raise QueueUnavailable("not connected to NATS")


async def test_a_message_not_queued_discards_its_raw_object(
    make_relay: Callable[..., Relay], receiver: WebhookReceiver
) -> None:
    raw = RecordingRaw()
    relay = make_relay(raw, queue=DownQueue())
    assert await relay.handle_envelope(envelope(), Session(peer_ip="x")) == r.QUEUE_UNAVAILABLE
    assert raw.discarded == [RawMessage(url="s3://b/fixed-id.eml")]
    assert receiver.bodies() == []
