"""Queue mode's JetStream side (nats-py): the connection, the stream and the durable consumer all relays share,
publishing accepted payloads, fetching them for the delivery workers, and the dead-letter subject.

NATS errors end here: callers see QueueUnavailable, or an empty fetch, never a nats-py exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats
import nats.errors
import nats.js.errors
import orjson
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    Header,
    RetentionPolicy,
    StatusCode,
    StorageType,
    StreamConfig,
)

from mailrelay._errors import QueueUnavailable
from mailrelay._pull import Acks, Puller, Replies

CONSUMER = "mailrelay"  # the durable pull consumer every relay on the stream shares
PUBLISH_TIMEOUT_SECS = 5.0  # the SMTP client waits at most this long for the stream's acknowledgement
CONNECT_TIMEOUT_SECS = 5.0
START_TIMEOUT_SECS = 15.0  # connecting and setting up stream and consumer at start-up
DEPTH_TIMEOUT_SECS = 2.0  # reading the stream's depth for a metrics scrape (Prometheus gives a scrape 10 s)
RECONNECT_WAIT_SECS = 1.0
ACK_BATCH_SECS = 0.005  # an ack waits at most this long for others (or the next publish) to share its write
DUPLICATE_WINDOW_SECS = 120.0  # a publish retried with the same Nats-Msg-Id within it is stored once
HEADER_ROOM = 1024  # bytes kept free under the server's max_payload for the headers of a queued message
MSG_ID_HEADER = "Nats-Msg-Id"
DELIVERY_ID_HEADER = "MailRelay-Delivery-Id"
ACCEPTED_AT_HEADER = "MailRelay-Accepted-At"
ERROR_HEADER = "MailRelay-Error"
ATTEMPTS_HEADER = "MailRelay-Attempts"
ROUTE_HEADER = "MailRelay-Route"  # the routes-file route of the message (absent: the default route)
V1_ACK_TOKENS = 9  # an ack subject without domain and account hash; with them, 12 (11 from older servers)
V2_ACK_TOKENS = 12

log = structlog.get_logger("mailrelay.queue")


def messages_subject(stream: str) -> str:
    """Where accepted payloads are published; the shared consumer reads only this subject."""
    return f"{stream}.messages"


def dead_letter_subject(stream: str) -> str:
    """Where payloads that could not be delivered go, with the last error; kept in the same stream."""
    return f"{stream}.dead"


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueDepth:
    """What the stream holds now, for all relays on it: payloads not yet acknowledged (waiting, being delivered or
    waiting for a retry) and dead letters not yet consumed."""

    messages: int
    dead_letters: int


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuedMessage:
    """One delivery of a queued payload: its bytes, its delivery id, which delivery from the stream this is
    (1 for the first), when the relay accepted it (Unix seconds), its route (None: unnamed), and the
    acknowledgements.

    `ack`, `nak` and `term` never raise: when the connection is down the server redelivers after the ack wait.
    With `_acks` the ack is sent with others (`_pull.Acks`), within ACK_BATCH_SECS.
    """

    body: bytes
    delivery_id: str
    number: int
    accepted_at: float
    _msg: Msg
    route: str | None = None
    _acks: Acks | None = None

    async def ack(self) -> None:
        if self._acks is not None:
            self._acks.add(self._msg)
            return
        await _quietly(self._msg.ack, "ack")

    async def nak(self, delay: float) -> None:
        await _quietly(lambda: self._msg.nak(delay=delay), "nak")


async def _quietly(action: Callable[[], Awaitable[None]], name: str) -> None:
    try:
        await action()
    except nats.errors.Error as exc:
        log.warning("queue_acknowledgement_failed", action=name, error=type(exc).__name__)


class JetStreamQueue:
    """Implements the Relay's MessageQueue and the workers' Inbox over one NATS connection.

    `open()` connects (reconnecting forever afterwards), creates the stream if it is missing (file storage,
    work-queue retention: a message leaves the stream once acknowledged; subjects `<stream>.messages` and
    `<stream>.dead`) and creates or updates the durable consumer `mailrelay` (explicit ack, `ack_wait`, unlimited
    deliveries: the workers count attempts themselves so that the last error reaches the dead-letter subject).
    """

    def __init__(self, *, servers: list[str], stream: str, ack_wait: float, shown_url: str) -> None:
        self.servers = servers
        self.stream = stream
        self.ack_wait = ack_wait
        self.shown_url = shown_url
        self.subject = messages_subject(stream)
        self.dead_subject = dead_letter_subject(stream)
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._pull: Puller | None = None
        self._replies: Replies | None = None
        self._acks = Acks(window=ACK_BATCH_SECS)
        self._closing = False

    async def open(self) -> None:
        """Connect and set up stream and consumer; QueueUnavailable when that fails within START_TIMEOUT_SECS."""
        try:
            async with asyncio.timeout(START_TIMEOUT_SECS):
                self._nc = await nats.connect(
                    servers=self.servers,
                    name="mailrelay",
                    connect_timeout=CONNECT_TIMEOUT_SECS,
                    reconnect_time_wait=RECONNECT_WAIT_SECS,
                    max_reconnect_attempts=-1,
                    error_cb=self._on_error,
                    disconnected_cb=self._on_disconnected,
                    reconnected_cb=self._on_reconnected,
                )
                self._js = self._nc.jetstream(timeout=PUBLISH_TIMEOUT_SECS)
                await self._ensure_stream(self._js)
                await self._js.add_consumer(
                    self.stream,
                    ConsumerConfig(
                        name=CONSUMER,
                        durable_name=CONSUMER,
                        filter_subject=self.subject,
                        ack_policy=AckPolicy.EXPLICIT,
                        deliver_policy=DeliverPolicy.ALL,
                        ack_wait=self.ack_wait,
                        max_deliver=-1,
                    ),
                )
                pull, replies = Puller(self._nc, stream=self.stream, consumer=CONSUMER), Replies(self._nc)
                await pull.start()
                await replies.start()
                self._pull, self._replies = pull, replies
        except QueueUnavailable:
            await self.close()
            raise
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            await self.close()
            raise QueueUnavailable(_reason(exc)) from None

    async def _ensure_stream(self, js: JetStreamContext) -> None:
        try:
            info = await js.stream_info(self.stream)
        except nats.js.errors.NotFoundError:
            await js.add_stream(
                StreamConfig(
                    name=self.stream,
                    subjects=[self.subject, self.dead_subject],
                    retention=RetentionPolicy.WORK_QUEUE,
                    storage=StorageType.FILE,
                    duplicate_window=DUPLICATE_WINDOW_SECS,
                )
            )
            log.info("queue_stream_created", stream=self.stream, subjects=[self.subject, self.dead_subject])
            return
        missing = {self.subject, self.dead_subject} - set(info.config.subjects or ())
        if missing:
            raise QueueUnavailable(f"stream {self.stream} exists but does not capture {', '.join(sorted(missing))}")

    def fits(self, size: int) -> bool:
        """Whether a payload of `size` bytes fits the server's max_payload (1 MB unless the server raised it)."""
        return self._nc is not None and size + HEADER_ROOM <= self._nc.max_payload

    async def enqueue(self, body: bytes, *, delivery_id: str, route: str | None = None) -> None:
        """Publish and wait for the stream's acknowledgement: stored (on disk, with file storage) when this returns.
        `route` (the routes-file route the message takes) travels in the ROUTE_HEADER."""
        headers = {
            MSG_ID_HEADER: delivery_id,
            DELIVERY_ID_HEADER: delivery_id,
            ACCEPTED_AT_HEADER: f"{time.time():.3f}",
        }
        if route is not None:
            headers[ROUTE_HEADER] = route
        await self._publish(self.subject, body, headers)

    async def dead_letter(self, message: QueuedMessage, *, error: str, attempts: int) -> None:
        """Store `message` under the dead-letter subject with the last error; QueueUnavailable when not stored."""
        headers = {
            MSG_ID_HEADER: f"{message.delivery_id}.dead",
            DELIVERY_ID_HEADER: message.delivery_id,
            ACCEPTED_AT_HEADER: f"{message.accepted_at:.3f}",
            ERROR_HEADER: error,
            **({ROUTE_HEADER: message.route} if message.route is not None else {}),
            ATTEMPTS_HEADER: str(attempts),
        }
        await self._publish(self.dead_subject, message.body, headers)

    async def _publish(self, subject: str, body: bytes, headers: dict[str, str]) -> None:
        """A JetStream publish: the stream's acknowledgement, with the stream named (Nats-Expected-Stream) as
        `JetStreamContext.publish` does, through our own reply subscription (`_pull.Replies`)."""
        nc, replies = self._nc, self._replies
        if nc is None or replies is None or not nc.is_connected:
            # While reconnecting nats-py would buffer the publish and send it later, after the SMTP client was
            # told 451: refuse at once instead, so a 451 almost never comes with a stored message.
            raise QueueUnavailable("not connected to NATS")
        headers[Header.EXPECTED_STREAM] = self.stream
        await self._acks.send()  # in the same write as the publish
        try:
            reply = await replies.request(subject, body, headers=headers, wait=PUBLISH_TIMEOUT_SECS)
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            raise QueueUnavailable(_reason(exc)) from None
        _check_stored(reply)

    async def fetch(self, batch: int, *, wait: float) -> list[QueuedMessage]:
        """Up to `batch` deliveries, waiting at most `wait` seconds for the first; [] on timeout or NATS trouble.
        Never more messages in this process than the last `batch` (see `_pull.Puller`)."""
        pull = self._pull
        if pull is None or not self.connected:  # closed (shutting down) or reconnecting
            await asyncio.sleep(wait if pull is None else min(wait, RECONNECT_WAIT_SECS))
            return []
        try:
            messages = await pull.take(batch, wait=wait)
        except (OSError, nats.errors.Error) as exc:
            log.debug("queue_fetch_failed", error=type(exc).__name__)
            await asyncio.sleep(RECONNECT_WAIT_SECS)
            return []
        return [queued for msg in messages if (queued := _queued(msg, self._acks)) is not None]

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    async def depth(self) -> QueueDepth:
        """The stream's per-subject message counts (one JetStream API request); QueueUnavailable when they cannot be
        read within DEPTH_TIMEOUT_SECS."""
        nc, js = self._nc, self._js
        if nc is None or js is None or not nc.is_connected:
            raise QueueUnavailable("not connected to NATS")
        try:
            async with asyncio.timeout(DEPTH_TIMEOUT_SECS):
                info = await js.stream_info(self.stream, subjects_filter=f"{self.stream}.*")
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            raise QueueUnavailable(_reason(exc)) from None
        counts = info.state.subjects or {}
        return QueueDepth(messages=counts.get(self.subject, 0), dead_letters=counts.get(self.dead_subject, 0))

    async def close(self) -> None:
        self._closing = True
        if self._nc is not None and self._nc.is_connected:
            await self._acks.send()
        nc, self._nc, self._js, self._pull = self._nc, None, None, None
        if nc is not None and not nc.is_closed:
            with contextlib.suppress(OSError, nats.errors.Error):
                await nc.close()

    async def _on_error(self, exc: Exception) -> None:
        log.debug("queue_connection_error", error=type(exc).__name__)

    async def _on_disconnected(self) -> None:
        if self._pull is not None:
            self._pull.forget()
        if not self._closing:
            log.warning("queue_disconnected", nats=self.shown_url)

    async def _on_reconnected(self) -> None:
        log.info("queue_reconnected", nats=self.shown_url)


def _queued(msg: Msg, acks: Acks) -> QueuedMessage | None:
    """None for a message that is no JetStream delivery (its reply subject is not an ack subject)."""
    headers = msg.headers or {}
    number = _delivery_number(msg.reply)
    delivery_id = headers.get(DELIVERY_ID_HEADER)
    try:
        accepted_at: float | None = float(headers.get(ACCEPTED_AT_HEADER, ""))
    except ValueError:
        accepted_at = None
    if number is None or not delivery_id or accepted_at is None:  # not written by a relay: the whole metadata
        try:
            metadata = msg.metadata
        except nats.errors.Error:
            return None
        number = metadata.num_delivered
        delivery_id = delivery_id or f"seq-{metadata.sequence.stream}"
        accepted_at = metadata.timestamp.timestamp() if accepted_at is None else accepted_at
    return QueuedMessage(
        body=msg.data,
        delivery_id=delivery_id,
        number=number,
        accepted_at=accepted_at,
        _msg=msg,
        route=headers.get(ROUTE_HEADER),
        _acks=acks,
    )


def _delivery_number(reply: str) -> int | None:
    """`msg.metadata.num_delivered` from the ack subject alone (the metadata costs 5 us a message: a datetime and
    three objects): `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`, or
    with domain and account hash after `ACK` (and more tokens at the end). None for any other subject."""
    tokens = reply.split(".")
    if len(tokens) == V1_ACK_TOKENS:
        number = tokens[Msg.Ack.NumDelivered - 2]
    elif len(tokens) >= V2_ACK_TOKENS - 1:
        number = tokens[Msg.Ack.NumDelivered]
    else:
        return None
    if tokens[0] != Msg.Ack.Prefix0 or tokens[1] != Msg.Ack.Prefix1 or not number.isdigit():
        return None
    return int(number)


def _check_stored(reply: Msg) -> None:
    """The stream's answer to a publish: QueueUnavailable unless it stored the message (a duplicate within the
    window counts as stored)."""
    if reply.headers and reply.headers.get(Header.STATUS) == StatusCode.SERVICE_UNAVAILABLE:
        raise QueueUnavailable(_reason(nats.js.errors.NoStreamResponseError()))
    try:
        answer = orjson.loads(reply.data)  # json.loads' answer in a tenth of the time
    except orjson.JSONDecodeError:
        raise QueueUnavailable("unreadable acknowledgement") from None
    if not isinstance(answer, dict):
        raise QueueUnavailable("unreadable acknowledgement")
    error = answer.get("error")  # an error answer has a "seq" too (0)
    if isinstance(error, dict):
        raise QueueUnavailable(f"JetStream error {error.get('err_code') or error.get('code')}")
    if error is not None or "seq" not in answer:
        raise QueueUnavailable("unreadable acknowledgement")


def _reason(exc: BaseException) -> str:
    """Why the queue failed, short and without the URL (nats-py messages can carry the server address)."""
    if isinstance(exc, TimeoutError | nats.errors.TimeoutError):
        return "no acknowledgement in time"
    if isinstance(exc, nats.js.errors.NoStreamResponseError):
        return "no stream answered"
    if isinstance(exc, nats.js.errors.APIError):
        return f"JetStream error {exc.err_code or exc.code}"
    return type(exc).__name__
