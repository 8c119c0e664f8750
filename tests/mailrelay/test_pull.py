"""Queue mode's own NATS traffic against a real nats-server -js: pull requests sized to the room the workers give,
acks sent together, publishes through the queue's reply subscription and the stream's refusals."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from mailrelay._errors import QueueUnavailable
from mailrelay._pull import Replies
from mailrelay._queue import ACK_BATCH_SECS, CONSUMER, JetStreamQueue
from tests.mailrelay.waiting import eventually
from tests.nats_server import NatsServer


@pytest.fixture
async def queue(nats_server: NatsServer) -> AsyncIterator[JetStreamQueue]:
    opened = JetStreamQueue(
        servers=[nats_server.url], stream=f"P{uuid.uuid4().hex[:12]}", ack_wait=30, shown_url=nats_server.url
    )
    await opened.open()
    yield opened
    await opened.close()


@pytest.fixture
async def observer(nats_server: NatsServer) -> AsyncIterator[Client]:
    """A second connection: consumer and stream state, and a core subscriber on the JetStream API subjects."""
    nc = await nats.connect(nats_server.url)
    yield nc
    await nc.close()


async def test_no_more_messages_come_to_the_relay_than_the_room_it_gave(
    queue: JetStreamQueue, observer: Client
) -> None:
    for number in range(5):
        await queue.enqueue(b"{}", delivery_id=f"m{number}")
    assert len(await queue.fetch(2, wait=2)) == 2
    await asyncio.sleep(0.2)  # anything else that were on its way would have come by now
    consumer = await observer.jetstream().consumer_info(queue.stream, CONSUMER)
    assert (consumer.num_ack_pending, consumer.num_pending) == (2, 3)


async def test_one_pull_request_serves_the_room_it_asked_for(queue: JetStreamQueue, observer: Client) -> None:
    """Four workers free, messages arriving one by one: one request brings all four (nats-py's fetch made one per
    call)."""
    taken = []
    for number in range(4):
        fetching = asyncio.ensure_future(queue.fetch(4 - len(taken), wait=5))
        await asyncio.sleep(0.05)
        await queue.enqueue(b"{}", delivery_id=f"one-by-one-{number}")
        taken += await fetching
    assert [message.delivery_id for message in taken] == [f"one-by-one-{number}" for number in range(4)]
    assert _pull_requests(queue) == 1


async def test_a_fetch_that_may_not_wait_hands_over_what_came_and_asks_for_nothing(
    queue: JetStreamQueue, observer: Client
) -> None:
    """The paused workers' fetch (wait=0): what earlier requests brought, no new request."""
    for number in range(2):
        await queue.enqueue(b"{}", delivery_id=f"w{number}")
    first = await queue.fetch(2, wait=2)  # returns with the first message; the second may come just after
    await asyncio.sleep(0.2)
    rest = await queue.fetch(2, wait=0)
    assert (sorted(m.delivery_id for m in first + rest), _pull_requests(queue)) == (["w0", "w1"], 1)


async def test_acks_reach_the_stream_within_the_batch_window(queue: JetStreamQueue, observer: Client) -> None:
    for number in range(3):
        await queue.enqueue(b"{}", delivery_id=f"a{number}")
    messages = await queue.fetch(3, wait=2)
    for message in messages:
        await message.ack()
    await asyncio.sleep(ACK_BATCH_SECS + 0.2)
    consumer = await observer.jetstream().consumer_info(queue.stream, CONSUMER)
    assert (len(messages), consumer.num_ack_pending, consumer.num_pending) == (3, 0, 0)


async def test_a_publish_the_stream_refuses_is_queue_unavailable_with_its_error_code(
    queue: JetStreamQueue, observer: Client
) -> None:
    js = observer.jetstream()
    config = (await js.stream_info(queue.stream)).config
    config.max_msg_size = 16
    await js.update_stream(config)
    with pytest.raises(QueueUnavailable) as refused:
        await queue.enqueue(b'{"subject": "too long for the stream"}', delivery_id="over")
    assert refused.value.reason == "JetStream error 10054"  # message size exceeds maximum allowed


async def test_a_publish_nothing_stores_is_queue_unavailable(queue: JetStreamQueue, observer: Client) -> None:
    await observer.jetstream().delete_stream(queue.stream)
    with pytest.raises(QueueUnavailable) as refused:
        await queue.enqueue(b"{}", delivery_id="nowhere")
    assert refused.value.reason == "no stream answered"


async def test_a_request_without_a_reply_times_out(observer: Client) -> None:
    silent = f"silent.{uuid.uuid4().hex}"
    await observer.subscribe(silent, cb=_append_to([]))  # a listener (so no 503 "no responders") that never answers
    replies = Replies(observer)
    await replies.start()
    with pytest.raises(TimeoutError):
        await replies.request(silent, b"{}", headers={}, wait=0.2)


async def test_a_take_outlasts_the_timer_an_earlier_take_left(queue: JetStreamQueue) -> None:
    await queue.enqueue(b"{}", delivery_id="first")
    (first,) = await queue.fetch(1, wait=0.3)  # came at once: the timer set for its 0.3 s is still set
    await first.ack()
    later = asyncio.ensure_future(queue.fetch(1, wait=10))
    await asyncio.sleep(0.5)  # the earlier take's timer fires meanwhile
    await queue.enqueue(b"{}", delivery_id="second")
    (second,) = await later
    assert second.delivery_id == "second"


async def test_a_short_request_times_out_while_a_longer_one_still_gets_its_reply(observer: Client) -> None:
    late = f"late.{uuid.uuid4().hex}"
    held: list[Msg] = []
    await observer.subscribe(f"{late}.*", cb=_append_to(held))  # answers only when the test says so
    replies = Replies(observer)
    await replies.start()
    longer = asyncio.ensure_future(replies.request(f"{late}.long", b"{}", headers={}, wait=10))
    await eventually(lambda: len(held) == 1, what="the longer request held")
    with pytest.raises(TimeoutError):
        await replies.request(f"{late}.short", b"{}", headers={}, wait=0.2)  # its time is up before the longer one's
    first = held[0]
    assert first.subject == f"{late}.long" and first.reply is not None
    await observer.publish(first.reply, b"answer")
    assert (await longer).data == b"answer"


def _pull_requests(queue: JetStreamQueue) -> int:
    """The pull requests the queue's puller sent. (A core subscriber on the request subject, as first written, missed
    one now and then: the count is the puller's own.)"""
    assert queue._pull is not None
    return queue._pull.requests_sent


def _append_to(received: list[Msg]) -> Callable[[Msg], Awaitable[None]]:
    async def append(msg: Msg) -> None:
        received.append(msg)

    return append
