"""One gRPC HTTP/2 connection: grpclib's protocol with Bastion's limits, fair share of the loop and timers."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from typing import Any, cast

import structlog
from grpclib.protocol import EventsProcessor, H2Protocol, Stream
from h2.errors import ErrorCodes
from h2.events import PingAckReceived, RequestReceived, StreamReset
from h2.exceptions import ProtocolError as H2ProtocolError
from h2.settings import SettingCodes
from hpack.exceptions import HPACKError, OversizedHeaderListError
from hyperframe.frame import GoAwayFrame, RstStreamFrame, WindowUpdateFrame

from bastion._compat import grpclib as grpclib_compat
from bastion._connections import UNCOUNTED, Slot
from bastion._listener import LINGER_SECS, answer_and_close
from bastion.grpc import _hpack
from bastion.grpc._frames import InboundFrames, OutboundFrames
from bastion.grpc._limits import DEFAULT_LIMITS, Http2Limits, Limit, reset_budget
from bastion_core import running_loop

FLUSH_AT_BYTES = 64 * 1024  # asyncio's default high-water mark of a transport's buffer
CLOCK_SLACK_SECS = 0.01  # a timer may fire this much before its time (the loop's clock resolution)
log = structlog.get_logger("bastion.grpc")


class CoalescingTransport(asyncio.Transport):
    """A connection's transport whose writes of one event-loop iteration go to the socket as one write.

    grpclib writes each frame as it is made: a unary answer is three socket writes (headers, message,
    trailers), and each costs a system call in which the loopback TCP stack does its work (~10-15 us here).
    Frames written while the loop runs one round of callbacks (one answer, or several calls finishing
    together, and the flow-control updates) are joined and written once, right after that round
    (``call_soon``): the same bytes in the same order, a few microseconds later. ``close`` writes what is
    pending first; ``abort`` drops it, as the transport's own ``abort`` drops its buffer.

    Past ``FLUSH_AT_BYTES`` pending, the writes go out at once: the socket's flow control (``pause_writing``,
    which makes grpclib's streams wait) then stops a handler that answers without ever yielding, instead of
    a whole round of its output piling up here.

    With ``outbound``, every write is counted (:class:`OutboundFrames`) and ``on_limit`` hears of a limit it
    passed.
    """

    __slots__ = ("_lingering", "_loop", "_pending", "_pending_bytes", "on_limit", "outbound", "transport")

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        outbound: OutboundFrames | None = None,
        on_limit: Callable[[Limit], None] | None = None,
    ) -> None:
        super().__init__()
        self.transport = transport
        self._loop = loop
        self._pending: list[bytes | bytearray | memoryview] = []
        self._pending_bytes = 0
        self._lingering = False
        self.outbound = outbound
        self.on_limit = on_limit

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data or self._lingering:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self.outbound is not None:
            limit = self.outbound.written(data)
            if limit is not None and self.on_limit is not None:
                self.on_limit(limit)
        if self._pending_bytes >= FLUSH_AT_BYTES:
            self.flush()

    def flush(self) -> None:
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        if pending and not self._lingering and not self.transport.is_closing():
            self.transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        if not self._lingering:  # else the linger timer closes it
            self.transport.close()

    def answer_and_close(self, data: bytes) -> None:
        """Write what is pending, then ``data`` (a GOAWAY), then FIN; close after the linger (the listener's
        ``answer_and_close``): a socket closed with the client's frames still unread would answer with RST,
        and the client could lose the GOAWAY before reading it. A client that does not read either is cut
        off (``abort``) a linger later: its unsent frames would hold the connection open for ever."""
        self.flush()
        self._lingering = True
        answer_and_close(self.transport, data, self._loop)
        self._loop.call_later(2 * LINGER_SECS, self.transport.abort)

    def abort(self) -> None:
        self._pending, self._pending_bytes = [], 0
        self.transport.abort()

    def is_closing(self) -> bool:
        # After the GOAWAY the connection is closing for grpclib too: a call still running then ends without
        # writing its trailers (h2 is closed and would refuse them, which grpclib logs as a server error).
        return self._lingering or self.transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)


def _connection_error_code(exc: H2ProtocolError) -> ErrorCodes:
    """The GOAWAY code for a connection error h2 raised: its own, except a field block that does not decode,
    which RFC 9113 4.3 makes a COMPRESSION_ERROR (h2 says PROTOCOL_ERROR)."""
    cause = exc.__cause__ or exc.__context__  # h2 4.1 raises it inside the handler without ``from``
    if isinstance(cause, HPACKError) and not isinstance(cause, OversizedHeaderListError):
        return ErrorCodes.COMPRESSION_ERROR
    return ErrorCodes(exc.error_code)


REQUIRED_PSEUDO_HEADERS: frozenset[str | bytes] = frozenset({":method", ":scheme", ":path"})
"""By name as grpclib has h2 decode them (``header_encoding="ascii"``: ``str``)."""


def well_formed(headers: Iterable[tuple[str | bytes, str | bytes]]) -> bool:
    """Whether a request's header list is one grpclib can take: every name non-empty, and ``:method``,
    ``:scheme`` and ``:path`` each present once with a value (RFC 9113 8.3.1). grpclib switches h2's own
    checks off and fails on such a request with a traceback, leaving the stream open. A malformed request
    ends the connection instead (GOAWAY PROTOCOL_ERROR, as Envoy does by default): RFC 9113 8.1.1 allows a
    stream error, but a client that sends them in a loop (1000 empty field names each, CVE-2019-9516) would
    make the server decode every one of them at no cost to itself; no conforming client sends one."""
    seen = 0
    for name, value in headers:
        if not name:
            return False
        if name in REQUIRED_PSEUDO_HEADERS:
            if not value:
                return False
            seen += 1
    return seen == len(REQUIRED_PSEUDO_HEADERS)


class _Streams(EventsProcessor):
    """grpclib's event processor, telling the connection when its last stream has closed (the idle clock)."""

    on_idle: Callable[[], None]

    def register(self, stream: Stream) -> Callable[[], None]:
        release = super().register(stream)

        def release_and_tell() -> None:
            release()
            if not self.streams:
                self.on_idle()

        return release_and_tell


class _H2Protocol(H2Protocol):
    """grpclib's HTTP/2 protocol with Bastion's limits (docs/grpc.md "Limits").

    - Input is read ahead of h2 by :class:`InboundFrames` (flood limits, refused streams) in turns of bounded
      work: past a turn's share, reading pauses and the rest is handled in the next loop iteration.
    - Writes are coalesced per loop iteration (:class:`CoalescingTransport`) and counted (outbound limits).
    - Past a limit: GOAWAY ENHANCE_YOUR_CALM and close; on a connection error h2 raised, GOAWAY with its code
      (grpclib closed without sending the one h2 prepared).
    - No stream for ``idle_timeout_secs``: GOAWAY NO_ERROR and close; with ``keepalive_interval_secs``, a PING
      each interval and a close when one is not answered within ``keepalive_timeout_secs``. One timer.
    - HPACK answers through ``_hpack.ResponseEncoder``; with ``memo_decoder``, header blocks are decoded through
      the Huffman memo (``_hpack.use_memo_decoder``).

    ``limits``, ``memo_decoder`` and ``slot`` are set on the protocol before ``connection_made`` (by the server's
    factory and the listener); the slot is released when the connection is lost.
    """

    limits: Http2Limits = DEFAULT_LIMITS
    memo_decoder = False
    slot: Slot = UNCOUNTED
    closed = False
    """The connection is ending: what the client still sends is dropped (see ``_goaway``)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # Nothing is encoded before the first answer, so the encoder can change here; the client's SETTINGS
        # (header table size) arrive later and reach the new one. Streams take the connection's transport
        # when they open, so every frame after the server's SETTINGS goes through the coalescing one.
        loop = self.loop = running_loop()
        limits = self.limits
        h2 = self.h2 = grpclib_compat.h2_connection(self.connection)
        h2.encoder = _hpack.ResponseEncoder()
        if self.memo_decoder:
            _hpack.use_memo_decoder(h2)
        self.transport = cast(asyncio.Transport, transport)
        self.outbound = OutboundFrames(limits)
        self.writer = CoalescingTransport(self.transport, loop, self.outbound, self._outbound_limit)
        grpclib_compat.replace_transport(self.connection, self.writer)
        h2.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams})
        self.connection.flush()
        self.inbound = InboundFrames(limits, self, self.outbound, loop.time, max_frame_size=h2.max_inbound_frame_size)
        self.resets = reset_budget(loop.time)
        self.processor = processor = _Streams(self.handler, self.connection)
        processor.on_idle = self._idle
        self._input = bytearray()  # what arrived and waits for a later turn
        self._turn_scheduled = False
        self._reading_paused = False
        self._flooded = False
        self._timer: asyncio.TimerHandle | None = None
        self._idle_at: float | None = None
        self._ping_at: float | None = None
        self._ack_by: float | None = None
        self._ping_data = b""
        if limits.keepalive_interval_secs > 0:
            self._ping_at = loop.time() + limits.keepalive_interval_secs
            self._arm(self._ping_at)
        self._idle()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self._input:
            self._input += data
            if not self._turn_scheduled:
                self._turn()
            return
        with memoryview(data) as view:
            done = self.inbound.read(view)
            if done < len(data) and not self.closed:
                self._input += view[done:]
        self._after_turn()

    def _turn(self) -> None:
        """Handle the input that waited, up to a turn's share."""
        self._turn_scheduled = False
        if self.closed:
            return
        with memoryview(self._input) as view:
            done = self.inbound.read(view)
        if self.closed:
            self._input.clear()
            return
        del self._input[:done]
        self._after_turn()

    def _after_turn(self) -> None:
        if self.closed:
            return
        self.connection.flush()
        if self.inbound.yielded:
            if not self._reading_paused:
                self._reading_paused = True
                self.transport.pause_reading()
            self._turn_scheduled = True
            self.loop.call_soon(self._turn)
        elif self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()

    def feed(self, data: memoryview) -> bool:
        connection = self.connection
        try:
            events = connection.feed(data)  # type: ignore[arg-type]  # h2 takes any buffer
        except H2ProtocolError as exc:
            log.info("http2_connection_error", code=_connection_error_code(exc).name, reason=str(exc)[:200])
            self._goaway(_connection_error_code(exc), replace=True)
            return False
        connection.flush()
        for event in events:
            if isinstance(event, StreamReset) and not self.resets.take():
                self.flood(Limit.STREAM_RESETS)
                return False
            if isinstance(event, PingAckReceived) and event.ping_data == self._ping_data:
                self._ack_by = None
            if isinstance(event, RequestReceived) and not well_formed(event.headers):
                self.protocol_error(ErrorCodes.PROTOCOL_ERROR, "a malformed request (RFC 9113 8.3.1)")
                return False
            self.processor.process(event)
            if connection.is_closing():  # the client's GOAWAY: grpclib closed the connection
                self.closed = True
                return False
        return True

    def stream_room(self) -> int:
        h2 = self.h2
        limit = min(self.limits.max_concurrent_streams, h2.local_settings.max_concurrent_streams)
        return limit - h2.open_inbound_streams

    def discard_fields(self, block: bytes) -> bool:
        try:
            self.h2.decoder.decode(block)
        except HPACKError as exc:
            oversized = isinstance(exc, OversizedHeaderListError)
            code = ErrorCodes.PROTOCOL_ERROR if oversized else ErrorCodes.COMPRESSION_ERROR
            self.protocol_error(code, f"a field block that does not decode: {exc}")
            return False
        return True

    def refuse(self, stream_id: int) -> bool:
        if not self.resets.take():
            self.flood(Limit.STREAM_RESETS)
            return False
        self.connection.flush()  # h2's frames first: they were made for earlier frames of the client
        self.writer.write(RstStreamFrame(stream_id, error_code=ErrorCodes.REFUSED_STREAM).serialize())
        return True

    def return_window(self, size: int) -> None:
        self.connection.flush()
        self.writer.write(WindowUpdateFrame(0, window_increment=size).serialize())

    def flood(self, limit: Limit) -> None:
        log.info("http2_flood", limit=limit.value)
        self._goaway(ErrorCodes.ENHANCE_YOUR_CALM, f"past {limit.value}")

    def protocol_error(self, code: ErrorCodes, reason: str) -> None:
        log.info("http2_connection_error", code=code.name, reason=reason[:200])
        self._goaway(code, reason)

    def _outbound_limit(self, limit: Limit) -> None:
        """Called from a write (inside a stream's send): the connection ends in the next loop iteration."""
        if not self._flooded:
            self._flooded = True
            self.loop.call_soon(self._outbound_flood, limit)

    def _outbound_flood(self, limit: Limit) -> None:
        if not self.closed:
            self.flood(limit)

    def _goaway(self, code: ErrorCodes, reason: str = "", *, replace: bool = False) -> None:
        """Send GOAWAY with ``code`` (RFC 9113 5.4.1), then close the connection and its calls.

        ``replace``: h2 has already queued a GOAWAY for the error it raised (and is closed); ours replaces it,
        so the code is the one chosen here (nothing else h2 queued matters on a connection that is closing).
        """
        h2 = self.h2
        if replace:
            h2.clear_outbound_data_buffer()
            goaway = GoAwayFrame(0, last_stream_id=h2.highest_inbound_stream_id, error_code=code).serialize()
        else:
            h2.close_connection(error_code=code, additional_data=reason.encode()[:256])
            goaway = h2.data_to_send()
        self.closed = True
        self._stop_timer()
        if self._reading_paused:  # what still arrives is read and dropped until the client closes
            self._reading_paused = False
            self.transport.resume_reading()
        self.writer.answer_and_close(goaway)
        self.processor.close("Protocol error")  # the calls end now; the socket after the linger

    def _idle(self) -> None:
        """No stream is open (the connection's start, or its last stream closed): the idle clock starts."""
        if not self.closed:
            self._idle_at = self.loop.time() + self.limits.idle_timeout_secs
            self._arm(self._idle_at)

    def _arm(self, when: float) -> None:
        """Have the timer fire at ``when`` or earlier (a later deadline is re-armed when it fires)."""
        timer = self._timer
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()
        self._timer = self.loop.call_at(when, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self.closed:
            return
        now = self.loop.time() + CLOCK_SLACK_SECS
        limits = self.limits
        if self._idle_at is not None and now >= self._idle_at:
            self._idle_at = None
            if not self.processor.streams:
                log.info("http2_idle_timeout", idle_secs=limits.idle_timeout_secs)
                self._goaway(ErrorCodes.NO_ERROR, "idle")
                return
        if self._ack_by is not None and now >= self._ack_by:
            log.info("http2_keepalive_timeout", timeout_secs=limits.keepalive_timeout_secs)
            self._goaway(ErrorCodes.NO_ERROR, "keepalive ping not answered")
            return
        if self._ping_at is not None and now >= self._ping_at:
            self._ping_at = now + limits.keepalive_interval_secs
            if self._ack_by is None:
                self._ack_by = now + limits.keepalive_timeout_secs
                self._ping_data = os.urandom(8)
                self.h2.ping(self._ping_data)
                self.connection.flush()
        deadlines = [when for when in (self._idle_at, self._ack_by, self._ping_at) if when is not None]
        if deadlines:
            self._arm(min(deadlines))

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def pause_writing(self) -> None:
        super().pause_writing()
        self.outbound.pause()

    def resume_writing(self) -> None:
        super().resume_writing()
        self.outbound.resume()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.slot.release()
        self.closed = True
        self._stop_timer()
        super().connection_lost(exc)
