"""Queue mode's own NATS traffic beside nats-py's JetStream API (public API only): pull requests (`Puller`), acks
sent together (`Acks`) and the publishes' replies (`Replies`).

Pull requests on the shared consumer go over core NATS: one inbox subscription for all of them, each request asking
for as many messages as the workers have room for, the deliveries collected as they arrive.

nats-py's `PullSubscription.fetch` makes a pull request per call and waits for each message on its own (a task, a
timer and a uuid4 per message, a no-wait probe and its 404 per call): under load that was about one request, and
its status message, per message delivered. Here a request lingers (`expires`) and asks for up to the room left, so
under load one request serves several messages and each arrives through the subscription's callback.

The protocol (JetStream's pull API): a request is a publish to `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`
with `{"batch": n, "expires": nanoseconds}` and a reply subject; the consumer sends up to n messages to that
subject, then, if the request ends before n were sent, a status message: 408 (expired), 409 (e.g. too many waiting
requests, consumer deleted) or 404 (nothing to send). Each request has a subject of its own under the inbox, where
its status message comes; the messages themselves keep their own subject.
"""

from __future__ import annotations

import asyncio
import itertools
import math

import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import DEFAULT_PREFIX, Header, StatusCode

MIN_EXPIRES_SECS = 0.001  # the server refuses shorter request lifetimes; a take with less time left waits only
EXPIRES_MARGIN_SECS = 0.0001  # a request ends just before the take waiting for it gives up
STALE_GRACE_SECS = 1.0  # a request whose end (its status message) never came is forgotten this long after it

log = structlog.get_logger("mailrelay.queue")


class Puller:
    """Pull requests for one durable consumer, and the messages they brought that nobody has taken yet.

    `take(room, wait)` returns up to `room` messages, waiting at most `wait` seconds for the first. It asks the
    consumer only for what `room` leaves once outstanding requests and messages not yet taken are counted, so the
    messages in this process never exceed the room the caller last gave (the workers' free slots; requests forgotten
    after a reconnect aside): none waits here for a slot while its ack wait runs. A request is made when nothing is
    outstanding, or when at least half of `room` is free, so under load one request brings several messages.
    """

    def __init__(self, nc: Client, *, stream: str, consumer: str) -> None:
        self._nc = nc
        self._next_subject = f"{DEFAULT_PREFIX}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._inbox = nc.new_inbox()
        self._ids = itertools.count()
        self.requests_sent = 0
        """Pull requests made so far (each a `$JS.API.CONSUMER.MSG.NEXT` publish)."""
        self._credits: dict[str, tuple[int, float]] = {}  # request id -> (messages still to come, when it ends)
        self._ready: list[Msg] = []
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._waiting_until = math.inf  # the deadline of the take waiting now
        self._loop = asyncio.get_running_loop()  # made inside the loop; looked up once (each look-up is a getpid)

    async def start(self) -> None:
        await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_message)

    def forget(self) -> None:
        """The connection dropped: the server ends the requests of a connection that went away."""
        self._credits.clear()

    async def take(self, room: int, *, wait: float) -> list[Msg]:
        loop = self._loop
        deadline = loop.time() + wait
        while not self._ready and (now := loop.time()) < deadline:
            await self._request(room, now, deadline)
            if self._ready:
                break
            # A future, and the timer only when none is set for this deadline or earlier: asyncio.Event and
            # asyncio.timeout cost a loop look-up (a getpid call) each, and a timer per take (made, then cancelled
            # when a message came first) was 2 us. A timer left from an earlier take is set again for this one's
            # deadline when it fires (`_on_timer`).
            waiter = self._waiter = loop.create_future()
            self._waiting_until = deadline
            if deadline < self._timer_at:
                self._set_timer(deadline)
            try:
                await waiter
            finally:
                self._waiter = None
        taken, self._ready = self._ready[:room], self._ready[room:]
        return taken

    async def _request(self, room: int, now: float, deadline: float) -> None:
        for request, (_count, ends) in list(self._credits.items()):
            if ends + STALE_GRACE_SECS < now:
                del self._credits[request]
        outstanding = sum(count for count, _ends in self._credits.values())
        wanted = room - outstanding - len(self._ready)
        expires = deadline - now - EXPIRES_MARGIN_SECS
        if wanted <= 0 or expires < MIN_EXPIRES_SECS or (outstanding and wanted * 2 < room):
            return
        request = str(next(self._ids))
        self.requests_sent += 1
        self._credits[request] = (wanted, now + expires)
        body = b'{"batch":%d,"expires":%d}' % (wanted, int(expires * 1e9))
        await self._nc.publish(self._next_subject, body, reply=f"{self._inbox}.{request}")

    async def _on_message(self, msg: Msg) -> None:
        status = msg.headers.get(Header.STATUS) if msg.headers else None
        if status is None:
            self._ready.append(msg)
            self._wake()
            # A delivered message keeps its own subject: it is counted against the oldest request (the consumer
            # serves one client's requests in order).
            credits = self._credits
            for request, (count, ends) in credits.items():
                if count > 1:
                    credits[request] = (count - 1, ends)
                else:
                    del credits[request]
                break
            return
        if status == StatusCode.CONTROL_MESSAGE:  # an idle heartbeat (not asked for)
            return
        # The request ended (408 expired, 404 nothing to send, 409 refused): its credits will not come.
        request = msg.subject.rpartition(".")[2]
        if self._credits.pop(request, None) is not None and status != StatusCode.CONFLICT:
            self._wake()  # a take still waiting asks again (after a 409 it waits out its time instead)
        elif status == StatusCode.CONFLICT:
            log.debug("queue_pull_refused", description=msg.headers.get(Header.DESCRIPTION) if msg.headers else None)

    def _wake(self) -> None:
        if self._waiter is not None:
            _wake(self._waiter)

    def _set_timer(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = self._loop.call_at(when, self._on_timer), when

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, math.inf
        if self._waiter is None:
            return
        if self._loop.time() < self._waiting_until:  # set for an earlier take
            self._set_timer(self._waiting_until)
        else:
            _wake(self._waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Acks:
    """Acknowledgements sent together: each one leaves at most ACK_BATCH_SECS after it was given, with the others
    given meanwhile, or earlier with the next publish (`send()`), in the same write to the socket. One write per
    ack was the biggest NATS cost per message under load (a loopback write wakes the server each time).

    Delivery stays at least once: an ack lost with the process (or the connection) means a redelivery.

    The timer stays set when a publish takes the acks along: whatever is given before it fires leaves with it, still
    within the window (a timer made and cancelled for each ack cost 3 us an ack under load).
    """

    def __init__(self, *, window: float) -> None:
        self._window = window
        self._pending: list[Msg] = []
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()

    def add(self, msg: Msg) -> None:
        self._pending.append(msg)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._window, self._send_later)

    def _send_later(self) -> None:
        self._timer = None
        if not self._pending:  # a publish took them along
            return
        task = asyncio.get_running_loop().create_task(self.send())
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def send(self) -> None:
        """Every pending ack, now (they reach the socket together: nats-py writes what is pending at once)."""
        pending, self._pending = self._pending, []
        for msg in pending:
            try:
                await msg.ack()
            except nats.errors.Error as exc:
                log.warning("queue_acknowledgement_failed", action="ack", error=type(exc).__name__)


class Replies:
    """Requests whose replies come to one inbox subscription of our own, for the publishes of queued payloads.

    nats-py's `request` (behind `JetStreamContext.publish`) does the same with a token from `secrets.token_hex` (a
    getrandom call) and a NUID, `asyncio.wait_for` and a fresh Future per request; here the token is a counter
    (the inbox is already unique), and a future is all a request costs: one timer, set for the earliest deadline,
    times out every request whose time is up (a timer per request was 4 us: a handle, a heap push, its cancel).
    """

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._prefix = f"{nc.new_inbox()}."
        self._ids = itertools.count()
        self._waiting: dict[str, tuple[asyncio.Future[Msg], float]] = {}  # token -> (reply, deadline)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._loop = asyncio.get_running_loop()  # made inside the loop; looked up once (each look-up is a getpid)

    async def start(self) -> None:
        await self._nc.subscribe(f"{self._prefix}*", cb=self._on_reply)

    async def request(self, subject: str, body: bytes, *, headers: dict[str, str], wait: float) -> Msg:
        """The reply to `body` published on `subject`; TimeoutError after `wait` seconds."""
        loop = self._loop
        token = str(next(self._ids))
        future: asyncio.Future[Msg] = loop.create_future()
        deadline = loop.time() + wait
        self._waiting[token] = (future, deadline)
        if deadline < self._timer_at:
            self._set_timer(deadline)
        try:
            await self._nc.publish(subject, body, reply=self._prefix + token, headers=headers)
            return await future
        finally:
            del self._waiting[token]

    async def _on_reply(self, msg: Msg) -> None:
        waiting = self._waiting.get(msg.subject[len(self._prefix) :])
        if waiting is not None and not waiting[0].done():
            waiting[0].set_result(msg)

    def _set_timer(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = self._loop.call_at(when, self._time_out), when

    def _time_out(self) -> None:
        """TimeoutError for the requests whose time is up; the timer again for the earliest of the others."""
        self._timer, self._timer_at = None, math.inf
        now, earliest = self._loop.time(), math.inf
        for future, deadline in self._waiting.values():
            if future.done():
                continue
            if deadline <= now:
                future.set_exception(TimeoutError())
            else:
                earliest = min(earliest, deadline)
        if earliest < math.inf:
            self._set_timer(earliest)
