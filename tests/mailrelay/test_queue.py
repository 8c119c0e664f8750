"""JetStreamQueue against a real nats-server -js: stream and consumer set-up, publish, fetch, acks, dead letters."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import nats
import pytest
from nats.aio.msg import Msg

from mailrelay._errors import QueueUnavailable
from mailrelay._queue import (
    CONSUMER,
    JetStreamQueue,
    _delivery_number,
    dead_letter_subject,
    messages_subject,
)
from tests.nats_server import NatsServer

OpenQueue = Callable[..., Awaitable[JetStreamQueue]]


@pytest.fixture
async def open_queue(nats_server: NatsServer) -> AsyncIterator[OpenQueue]:
    """Factory: an opened queue on the shared server, on a stream of the test's own (`stream=` to share one)."""
    opened: list[JetStreamQueue] = []

    async def make(*, stream: str | None = None, ack_wait: float = 30.0) -> JetStreamQueue:
        queue = JetStreamQueue(
            servers=[nats_server.url],
            stream=stream or f"T{uuid.uuid4().hex[:12]}",
            ack_wait=ack_wait,
            shown_url=nats_server.url,
        )
        opened.append(queue)
        await queue.open()
        return queue

    yield make
    for queue in opened:
        await queue.close()


async def test_open_creates_the_work_queue_stream_and_the_shared_consumer(
    open_queue: OpenQueue, nats_server: NatsServer
) -> None:
    queue = await open_queue(ack_wait=12)
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        stream = await js.stream_info(queue.stream)
        consumer = await js.consumer_info(queue.stream, CONSUMER)
    finally:
        await nc.close()
    assert set(stream.config.subjects or ()) == {messages_subject(queue.stream), dead_letter_subject(queue.stream)}
    assert (stream.config.retention, stream.config.storage) == ("workqueue", "file")
    assert (consumer.config.ack_policy, consumer.config.ack_wait, consumer.config.max_deliver) == ("explicit", 12, -1)
    assert consumer.config.filter_subject == messages_subject(queue.stream)


async def test_an_enqueued_payload_is_fetched_with_its_delivery_id_and_leaves_once_acked(
    open_queue: OpenQueue,
) -> None:
    queue = await open_queue()
    await queue.enqueue(b'{"subject":"hi"}', delivery_id="abc123")
    (message,) = await queue.fetch(5, wait=2)
    assert (message.body, message.delivery_id, message.number) == (b'{"subject":"hi"}', "abc123", 1)
    await message.ack()
    assert await queue.fetch(5, wait=0.3) == []


async def test_a_message_without_the_relay_headers_takes_its_id_and_time_from_the_stream(
    open_queue: OpenQueue, nats_server: NatsServer
) -> None:
    queue = await open_queue()
    nc = await nats.connect(nats_server.url)
    try:
        stored = await nc.jetstream().publish(messages_subject(queue.stream), b"{}")
    finally:
        await nc.close()
    (message,) = await queue.fetch(1, wait=2)
    metadata = message._msg.metadata
    assert (message.delivery_id, message.number, message.accepted_at) == (
        f"seq-{stored.seq}",
        1,
        metadata.timestamp.timestamp(),
    )


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param("$JS.ACK.MR.mailrelay.3.120.45.1764130000000000000.7", id="without-domain"),
        pytest.param("$JS.ACK._.acchash.MR.mailrelay.4.120.45.1764130000000000000.7.token", id="with-domain"),
        pytest.param("$JS.ACK.hub.acchash.MR.mailrelay.5.120.45.1764130000000000000.7", id="eleven-tokens"),
    ],
)
def test_the_delivery_number_read_from_the_ack_subject_is_the_metadata_one(reply: str) -> None:
    msg = Msg(_client=None, subject="MR.messages", reply=reply, data=b"{}", headers=None)  # type: ignore[arg-type]
    assert _delivery_number(reply) == msg.metadata.num_delivered


@pytest.mark.parametrize("reply", ["", "MR.messages", "$JS.ACK.MR.mailrelay.x.1.1.1.0", "$JS.API.MR.c.1.1.1.1.0"])
def test_a_subject_that_is_no_ack_subject_has_no_delivery_number(reply: str) -> None:
    assert _delivery_number(reply) is None


async def test_a_nakked_message_comes_back_as_the_next_delivery(open_queue: OpenQueue) -> None:
    queue = await open_queue()
    await queue.enqueue(b"{}", delivery_id="again")
    (first,) = await queue.fetch(1, wait=2)
    await first.nak(0.01)
    (second,) = await queue.fetch(1, wait=2)
    assert (second.delivery_id, second.number, second.accepted_at) == ("again", 2, first.accepted_at)
    await second.ack()


async def test_two_queues_on_one_stream_share_the_messages(open_queue: OpenQueue) -> None:
    """Two relays: whichever accepted a message, either may deliver it, and each gets a different one."""
    first = await open_queue()
    second = await open_queue(stream=first.stream)
    for number in range(2):
        await first.enqueue(b"{}", delivery_id=f"id-{number}")
    (one,) = await first.fetch(1, wait=2)
    (other,) = await second.fetch(1, wait=2)
    assert {one.delivery_id, other.delivery_id} == {"id-0", "id-1"}
    await one.ack()
    await other.ack()


async def test_a_publish_retried_with_the_same_delivery_id_is_stored_once(open_queue: OpenQueue) -> None:
    queue = await open_queue()
    await queue.enqueue(b"{}", delivery_id="once")
    await queue.enqueue(b"{}", delivery_id="once")
    assert [m.delivery_id for m in await queue.fetch(5, wait=1)] == ["once"]


async def test_dead_letters_keep_the_payload_id_and_last_error(open_queue: OpenQueue, nats_server: NatsServer) -> None:
    queue = await open_queue()
    await queue.enqueue(b'{"x":1}', delivery_id="poison")
    (message,) = await queue.fetch(1, wait=2)
    await queue.dead_letter(message, error="HTTP 422", attempts=1)
    await message.ack()
    nc = await nats.connect(nats_server.url)
    try:
        sub = await nc.jetstream().pull_subscribe(dead_letter_subject(queue.stream), stream=queue.stream)
        (dead,) = await sub.fetch(1, timeout=2)
    finally:
        await nc.close()
    assert dead.data == b'{"x":1}'
    assert dead.headers is not None
    assert (dead.headers["MailRelay-Delivery-Id"], dead.headers["MailRelay-Error"]) == ("poison", "HTTP 422")
    assert dead.headers["MailRelay-Attempts"] == "1"


async def test_max_payload_decides_what_fits(open_queue: OpenQueue) -> None:
    queue = await open_queue()
    assert queue.fits(100_000)
    assert not queue.fits(1024 * 1024)  # nats-server's default max_payload is 1 MB


async def test_enqueue_after_close_is_queue_unavailable(open_queue: OpenQueue) -> None:
    queue = await open_queue()
    await queue.close()
    with pytest.raises(QueueUnavailable, match="not connected"):
        await queue.enqueue(b"{}", delivery_id="late")


async def test_an_existing_stream_without_our_subjects_is_refused(nats_server: NatsServer) -> None:
    name = f"T{uuid.uuid4().hex[:12]}"
    nc = await nats.connect(nats_server.url)
    try:
        await nc.jetstream().add_stream(name=name, subjects=[f"other.{name}"])
    finally:
        await nc.close()
    queue = JetStreamQueue(servers=[nats_server.url], stream=name, ack_wait=30, shown_url=nats_server.url)
    with pytest.raises(QueueUnavailable, match=f"stream {name} exists but does not capture"):
        await queue.open()


async def test_no_server_is_queue_unavailable_without_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from bastion_core.testing import free_port

    monkeypatch.setattr("mailrelay._queue.START_TIMEOUT_SECS", 1.0)
    url = f"nats://user:s3cret@127.0.0.1:{free_port()}"
    queue = JetStreamQueue(servers=[url], stream="S", ack_wait=30, shown_url="masked")
    with pytest.raises(QueueUnavailable) as caught:
        await queue.open()
    assert "s3cret" not in str(caught.value)
