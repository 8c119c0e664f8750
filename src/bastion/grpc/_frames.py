"""The frames of one HTTP/2 connection, counted before h2 sees them (inbound) and as they are written (outbound).

:class:`InboundFrames` walks the client's bytes frame header by frame header, ahead of h2: it counts what
the flood limits count (Envoy's), cuts the input into turns of bounded work, and keeps from h2 the field
blocks of streams opened beyond ``max_concurrent_streams`` (refused with REFUSED_STREAM, RFC 9113 5.1.2)
and the frames that follow on those streams. :class:`OutboundFrames` counts the frames the server writes.
No I/O here: the connection (a :class:`FrameSink`) feeds h2 and writes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Protocol

from h2.errors import ErrorCodes
from hyperframe.exceptions import HyperframeError
from hyperframe.frame import Frame

from bastion.grpc._limits import Http2Limits, Limit, TokenBucket

PREFACE_BYTES = 24  # RFC 9113 3.4: "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER_BYTES = 9  # RFC 9113 4.1: length (24 bits), type, flags, stream id (31 bits)
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
CONTROL_TYPES = frozenset({RST_STREAM, SETTINGS, PING})
"""The outbound frames Envoy's ``max_outbound_control_frames`` counts: those h2 queues in answer to the client."""

FRAMES_PER_TURN = 200
BYTES_PER_TURN = 64 * 1024
"""Input one connection may have processed in one event-loop turn (cut at a frame boundary): the rest waits for
the next turn, so a connection that floods cannot hold the loop from the others."""
REFUSED_REMEMBERED = 1024
"""Refused stream ids whose late frames are dropped (the client stops sending on them after one round trip)."""


class FrameSink(Protocol):
    """The connection's side: what :class:`InboundFrames` hands on or asks for."""

    def feed(self, data: memoryview) -> bool:
        """Give h2 these bytes (whole frames, or the part of one frame's body that arrived); ``False``: the
        connection has ended."""

    def stream_room(self) -> int:
        """How many more streams the client may open now (h2 has been fed every frame before this one)."""

    def discard_fields(self, block: bytes) -> bool:
        """Decode a field block h2 will not see (keeps the HPACK table in sync); ``False``: it did not decode
        and the connection has ended."""

    def refuse(self, stream_id: int) -> bool:
        """Reset a stream opened beyond the limit with REFUSED_STREAM; ``False``: the connection has ended."""

    def return_window(self, size: int) -> None:
        """Give the client back the connection window a dropped DATA frame used."""

    def flood(self, limit: Limit) -> None:
        """The client went past ``limit``: end the connection (GOAWAY ENHANCE_YOUR_CALM)."""

    def protocol_error(self, code: ErrorCodes, reason: str) -> None:
        """A connection error found before h2 could see it: end the connection with ``code``."""


class OutboundFrames:
    """Counts the frames the server writes: DATA frames (they allow the client WINDOW_UPDATEs), and, from the
    moment the socket stops taking writes (``pause_writing``) until it takes them again, every frame and the
    control frames (PING and SETTINGS ACKs, RST_STREAM) queued meanwhile.

    Every write is whole frames (h2's ``data_to_send``), so the scan reads only frame headers.
    """

    __slots__ = ("control_frames", "data_frames", "frames", "limits", "paused")

    def __init__(self, limits: Http2Limits) -> None:
        self.limits = limits
        self.data_frames = 0
        self.paused = False
        self.frames = 0
        self.control_frames = 0

    def pause(self) -> None:
        self.paused = True
        self.frames = self.control_frames = 0

    def resume(self) -> None:
        self.paused = False

    def written(self, data: bytes | bytearray | memoryview) -> Limit | None:
        """Count the frames in ``data``; the limit this write went past, if any."""
        offset, end = 0, len(data)
        if not self.paused:  # the socket takes writes: only DATA frames count (every write of a call)
            while offset + HEADER_BYTES <= end:
                if data[offset + 3] == DATA:
                    self.data_frames += 1
                offset += HEADER_BYTES + (data[offset] << 16 | data[offset + 1] << 8 | data[offset + 2])
            return None
        while offset + HEADER_BYTES <= end:
            kind = data[offset + 3]
            if kind == DATA:
                self.data_frames += 1
            self.frames += 1
            if kind in CONTROL_TYPES:
                self.control_frames += 1
            offset += HEADER_BYTES + (data[offset] << 16 | data[offset + 1] << 8 | data[offset + 2])
        if self.control_frames > self.limits.max_outbound_control_frames:
            return Limit.OUTBOUND_CONTROL_FRAMES
        if self.frames > self.limits.max_outbound_frames:
            return Limit.OUTBOUND_FRAMES
        return None


class _Mode:
    """What happens to a frame: handed to h2, dropped, kept from h2 (its field block decoded apart), or, a HEADERS
    frame opening a stream, handed on or refused depending on the streams open."""

    PASS, DROP, CAPTURE, OPEN = range(4)


_FRAME_HEADER = struct.Struct("!HBBBL")


class InboundFrames:
    """The client's side of one connection, read ahead of h2 (see the module's doc).

    :meth:`read` takes what arrived and returns how much of it was dealt with: everything but a frame header
    that has not all arrived, or less when the turn's share (``FRAMES_PER_TURN``, ``BYTES_PER_TURN``) is
    spent; then ``yielded`` is true and the caller comes back with the rest in a later turn.

    Counted, as Envoy counts them: PING and SETTINGS frames without ACK (each makes the server queue an ACK)
    against a token bucket (``max_outbound_control_frames`` at once, ``max_inbound_control_frames_per_sec``
    after); PRIORITY frames against ``max_inbound_priority_frames_per_stream * (1 + streams opened)``;
    WINDOW_UPDATE frames against ``1 + 2 * (streams opened + max_inbound_window_update_frames_per_data_frame_sent
    * DATA frames sent)``; DATA without END_STREAM and HEADERS/CONTINUATION with nothing in them, in a row,
    against ``max_consecutive_inbound_frames_with_empty_payload``; the bytes of one field block (HEADERS plus
    its CONTINUATIONs) against ``max_header_bytes`` (CVE-2024-27316).
    """

    def __init__(
        self,
        limits: Http2Limits,
        sink: FrameSink,
        outbound: OutboundFrames,
        clock: Callable[[], float],
        *,
        max_frame_size: int,
        preface: bool = True,
    ) -> None:
        self.limits = limits
        self.sink = sink
        self.outbound = outbound
        self.max_frame_size = max_frame_size
        self.control = TokenBucket(limits.max_outbound_control_frames, limits.max_inbound_control_frames_per_sec, clock)
        self.yielded = False
        self.streams_opened = 0
        self.priority_frames = 0
        self.window_updates = 0
        self.empty_in_a_row = 0
        self._preface = PREFACE_BYTES if preface else 0
        self._highest = 0  # the highest stream id a HEADERS frame opened (or tried to)
        self._room = 0  # streams that may open before h2 is asked again (a lower bound: streams only close)
        self._refused: dict[int, None] = {}  # recently refused stream ids, oldest first
        self._mode = _Mode.PASS  # of the frame whose body is being read
        self._left = 0  # bytes of that body still to come
        self._header = b""  # a captured frame: its header and its body so far
        self._payload = bytearray()
        self._block: int | None = None  # a field block awaits CONTINUATION frames: their mode
        self._block_stream = 0
        self._block_bytes = 0
        self._fragments: list[bytes] = []  # of a captured field block
        self._refusing = 0  # the stream to refuse once its captured field block is decoded

    def read(self, data: memoryview) -> int:
        """Deal with ``data`` up to the turn's share; the number of bytes dealt with."""
        pos, end, frames = 0, len(data), 0
        run = 0  # bytes from here to pos are handed to h2 at the next frame kept from it, or at the end
        self.yielded = False
        if self._preface:
            pos = min(self._preface, end)
            self._preface -= pos
        while True:
            if self._left:
                size = min(self._left, end - pos)
                if self._mode == _Mode.CAPTURE:
                    self._payload += data[pos : pos + size]
                pos += size
                self._left -= size
                if self._mode != _Mode.PASS:
                    run = pos
                if self._left:
                    break
                if self._mode == _Mode.CAPTURE and not self._captured():
                    return pos
                continue
            if frames >= FRAMES_PER_TURN or pos >= BYTES_PER_TURN:
                self.yielded = pos < end
                break
            if end - pos < HEADER_BYTES:
                break
            high, low, kind, flags, stream = _FRAME_HEADER.unpack_from(data, pos)
            length, stream = (high << 8) + low, stream & 0x7FFFFFFF
            padded = kind in (DATA, HEADERS) and flags & PADDED and length
            if padded and end - pos <= HEADER_BYTES:
                break  # the pad length is needed to see whether the frame carries anything
            frames += 1
            if length > self.max_frame_size:
                self.sink.protocol_error(ErrorCodes.FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                return pos
            payload = length - (1 + data[pos + HEADER_BYTES] if padded else 0)
            mode = self._classify(kind, flags, stream, length, payload)
            if mode is None:
                return pos
            if mode != _Mode.PASS:
                if run < pos and not self.sink.feed(data[run:pos]):
                    return pos
                run = pos
                if mode == _Mode.OPEN:  # h2 has every frame before this one: it knows the streams open
                    mode = self._open(stream)
                if mode == _Mode.CAPTURE:
                    self._header, self._payload = bytes(data[pos : pos + HEADER_BYTES]), bytearray()
            if kind == HEADERS and not flags & END_HEADERS:
                self._block, self._block_stream, self._block_bytes = mode, stream, length
            pos += HEADER_BYTES
            if mode != _Mode.PASS:
                run = pos
            self._mode, self._left = mode, length
            if not length and mode == _Mode.CAPTURE and not self._captured():
                return pos
        if run < pos:
            self.sink.feed(data[run:pos])
        return pos

    def _classify(self, kind: int, flags: int, stream: int, length: int, payload: int) -> int | None:
        """Count the frame; what to do with it (``None``: a limit was passed and the connection ends)."""
        limits = self.limits
        if self._block is not None:
            if kind != CONTINUATION or stream != self._block_stream:
                if self._block == _Mode.CAPTURE:
                    self.sink.protocol_error(ErrorCodes.PROTOCOL_ERROR, "a field block without its CONTINUATION")
                    return None
                self._block = None  # h2 sees the frame and ends the connection
                return self._classify(kind, flags, stream, length, payload)
            mode = self._block
            self._block_bytes += length
            if self._block_bytes > limits.max_header_bytes:
                self.sink.flood(Limit.HEADER_BLOCK)
                return None
            if not self._counted_empty(length == 0):
                return None
            if flags & END_HEADERS:
                self._block = None
            return mode
        if kind == DATA:
            if not self._counted_empty(payload == 0 and not flags & END_STREAM):
                return None
            if stream in self._refused:
                if length:
                    self.sink.return_window(length)
                return _Mode.DROP
            return _Mode.PASS
        if kind == HEADERS:
            fragment = payload - (5 if flags & PRIORITY_FLAG else 0)
            if not self._counted_empty(fragment <= 0 and not flags & END_STREAM):
                return None
            if length > limits.max_header_bytes:
                self.sink.flood(Limit.HEADER_BLOCK)
                return None
            if stream in self._refused:
                return _Mode.CAPTURE  # trailers of a refused stream: decoded, not handed on
            if stream & 1 and stream > self._highest:
                self._highest = stream
                self.streams_opened += 1
                return _Mode.OPEN
            return _Mode.PASS
        if kind in (PING, SETTINGS):
            if not flags & ACK and not self.control.take():
                self.sink.flood(Limit.INBOUND_CONTROL_FRAMES)
                return None
            return _Mode.PASS
        if kind == PRIORITY:
            self.priority_frames += 1
            if self.priority_frames > limits.max_inbound_priority_frames_per_stream * (1 + self.streams_opened):
                self.sink.flood(Limit.PRIORITY_FRAMES)
                return None
        elif kind == WINDOW_UPDATE:
            self.window_updates += 1
            ratio = limits.max_inbound_window_update_frames_per_data_frame_sent
            if self.window_updates > 1 + 2 * (self.streams_opened + ratio * self.outbound.data_frames):
                self.sink.flood(Limit.WINDOW_UPDATE_FRAMES)
                return None
        return _Mode.DROP if stream in self._refused else _Mode.PASS

    def _open(self, stream: int) -> int:
        """A HEADERS frame opening ``stream``: handed on, or kept and refused once its field block is read."""
        if self._room <= 0:
            self._room = self.sink.stream_room()
        if self._room > 0:
            self._room -= 1
            return _Mode.PASS
        self._refusing = stream
        self._refused[stream] = None
        if len(self._refused) > REFUSED_REMEMBERED:
            del self._refused[next(iter(self._refused))]
        return _Mode.CAPTURE

    def _counted_empty(self, empty: bool) -> bool:
        """Count a frame that can carry a payload; ``False`` when it was one empty frame too many in a row."""
        if not empty:
            self.empty_in_a_row = 0
            return True
        self.empty_in_a_row += 1
        if self.empty_in_a_row > self.limits.max_consecutive_inbound_frames_with_empty_payload:
            self.sink.flood(Limit.EMPTY_FRAMES)
            return False
        return True

    def _captured(self) -> bool:
        """A frame kept from h2 has all arrived: keep its field block fragment; at the block's end, decode the
        block and refuse the stream it opened. ``False``: the connection has ended."""
        try:
            frame, _ = Frame.parse_frame_header(memoryview(self._header))
            frame.parse_body(memoryview(self._payload))
        except HyperframeError as exc:
            self.sink.protocol_error(ErrorCodes.PROTOCOL_ERROR, f"a malformed frame: {exc}")
            return False
        self._fragments.append(getattr(frame, "data", b""))
        if not self._header[4] & END_HEADERS:
            return True
        block, self._fragments = b"".join(self._fragments), []
        if not self.sink.discard_fields(block):
            return False
        stream, self._refusing = self._refusing, 0
        return not stream or self.sink.refuse(stream)
