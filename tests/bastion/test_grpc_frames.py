"""The frame accounting ahead of h2 (``bastion.grpc._frames``): counts, turns, refused streams; no event loop."""

from __future__ import annotations

from dataclasses import replace

import pytest
from h2.errors import ErrorCodes
from hpack import Encoder

from bastion.config import GrpcSettings
from bastion.grpc._frames import (
    BYTES_PER_TURN,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    FRAMES_PER_TURN,
    HEADERS,
    PADDED,
    PING,
    PREFACE_BYTES,
    PRIORITY,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    InboundFrames,
    OutboundFrames,
)
from bastion.grpc._limits import Http2Limits, Limit, TokenBucket

LIMITS = Http2Limits()
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
ACK = 0x1


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


class Sink:
    """Records what the reader hands on; ``room`` streams may open."""

    def __init__(self, room: int = 100) -> None:
        self.fed = bytearray()
        self.room = room
        self.blocks: list[bytes] = []
        self.refused: list[int] = []
        self.windows: list[int] = []
        self.floods: list[Limit] = []
        self.errors: list[ErrorCodes] = []

    def feed(self, data: memoryview) -> bool:
        self.fed += data
        return True

    def stream_room(self) -> int:
        return self.room

    def discard_fields(self, block: bytes) -> bool:
        self.blocks.append(block)
        return True

    def refuse(self, stream_id: int) -> bool:
        self.refused.append(stream_id)
        return True

    def return_window(self, size: int) -> None:
        self.windows.append(size)

    def flood(self, limit: Limit) -> None:
        self.floods.append(limit)

    def protocol_error(self, code: ErrorCodes, reason: str) -> None:
        self.errors.append(code)


def reader(sink: Sink, limits: Http2Limits = LIMITS, now: list[float] | None = None) -> InboundFrames:
    clock = now or [0.0]
    return InboundFrames(limits, sink, OutboundFrames(limits), lambda: clock[0], max_frame_size=16_384)


def read_all(frames: InboundFrames, data: bytes) -> int:
    """Read ``data`` turn after turn, as the connection does; the number of turns."""
    turns, view = 0, memoryview(data)
    while view:
        turns += 1
        done = frames.read(view)
        view = view[done:]
        if not frames.yielded:
            break
    return turns


def test_frames_within_the_limits_reach_h2_unchanged_even_split_anywhere() -> None:
    data = (
        PREFACE
        + frame(SETTINGS, 0, 0)
        + frame(HEADERS, END_HEADERS, 1, b"\x82")
        + frame(DATA, END_STREAM, 1, b"x" * 40)
    )
    for cut in range(1, len(data)):
        sink = Sink()
        frames = reader(sink)
        head = frames.read(memoryview(data[:cut]))
        frames.read(memoryview(data[head:]))
        assert bytes(sink.fed) == data and not sink.floods, cut


def test_a_turn_ends_at_a_frame_boundary_after_its_share_of_frames() -> None:
    sink = Sink()
    frames = reader(sink, replace(LIMITS, max_outbound_control_frames=10**6))
    data = PREFACE + frame(PING, 0, 0, b"\x00" * 8) * (FRAMES_PER_TURN * 3)
    assert read_all(frames, data) == 3
    assert bytes(sink.fed) == data


def test_a_turn_ends_after_its_share_of_bytes() -> None:
    sink = Sink()
    frames = reader(sink)
    body = frame(DATA, 0, 1, b"x" * 16_000)
    done = frames.read(memoryview(PREFACE + body * 10))
    assert frames.yielded and BYTES_PER_TURN <= done < BYTES_PER_TURN + len(body)
    assert (done - PREFACE_BYTES) % len(body) == 0


@pytest.mark.parametrize(("kind", "flags"), [(PING, 0), (SETTINGS, 0)], ids=["ping", "settings"])
def test_control_frames_past_the_burst_are_a_flood_and_the_rate_refills_it(kind: int, flags: int) -> None:
    now = [0.0]
    sink = Sink()
    frames = reader(sink, replace(LIMITS, max_outbound_control_frames=5, max_inbound_control_frames_per_sec=10), now)
    payload = b"\x00" * 8 if kind == PING else b""
    read_all(frames, PREFACE + frame(kind, flags, 0, payload) * 5)
    assert not sink.floods
    now[0] += 0.1  # one more
    read_all(frames, frame(kind, flags, 0, payload))
    assert not sink.floods
    read_all(frames, frame(kind, flags, 0, payload))
    assert sink.floods == [Limit.INBOUND_CONTROL_FRAMES]


def test_acks_are_not_counted() -> None:
    sink = Sink()
    frames = reader(sink, replace(LIMITS, max_outbound_control_frames=1))
    read_all(frames, PREFACE + (frame(PING, ACK, 0, b"\x00" * 8) + frame(SETTINGS, ACK, 0)) * 50)
    assert not sink.floods


def test_empty_frames_in_a_row_are_a_flood_and_a_full_one_resets_the_count() -> None:
    sink = Sink()
    frames = reader(sink)  # max_consecutive_inbound_frames_with_empty_payload = 1
    read_all(frames, PREFACE + (frame(DATA, 0, 1) + frame(DATA, 0, 1, b"x")) * 5 + frame(DATA, END_STREAM, 1) * 3)
    assert not sink.floods
    read_all(frames, frame(DATA, 0, 3) + frame(DATA, PADDED, 3, b"\x03abc"))  # padding only: empty too
    assert sink.floods == [Limit.EMPTY_FRAMES]


def test_priority_frames_are_allowed_per_stream_opened() -> None:
    sink = Sink()
    frames = reader(sink, replace(LIMITS, max_inbound_priority_frames_per_stream=3))
    priority = frame(PRIORITY, 0, 1, b"\x00\x00\x00\x00\x10")
    read_all(frames, PREFACE + priority * 3 + frame(HEADERS, END_HEADERS, 1, b"\x82") + priority * 3)
    assert not sink.floods
    read_all(frames, priority)
    assert sink.floods == [Limit.PRIORITY_FRAMES]


def test_window_updates_are_allowed_per_data_frame_sent() -> None:
    sink = Sink()
    frames = reader(sink, replace(LIMITS, max_inbound_window_update_frames_per_data_frame_sent=2))
    update = frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x01")
    read_all(frames, PREFACE + update)  # 1 + 2 * (0 streams + 2 * 0 DATA frames sent)
    assert not sink.floods
    frames.outbound.written(frame(DATA, 0, 1, b"x") * 2)
    read_all(frames, update * 8)  # now 1 + 2 * 2 * 2 = 9
    assert not sink.floods
    read_all(frames, update)
    assert sink.floods == [Limit.WINDOW_UPDATE_FRAMES]


def test_a_field_block_larger_than_max_header_bytes_is_a_flood_before_it_is_all_there() -> None:
    sink = Sink()
    frames = reader(sink, replace(LIMITS, max_header_bytes=20_000))
    read_all(frames, PREFACE + frame(HEADERS, 0, 1, b"\x00" * 16_000))
    assert not sink.floods
    read_all(frames, frame(CONTINUATION, 0, 1, b"\x00" * 5_000)[:20])
    assert sink.floods == [Limit.HEADER_BLOCK]


def test_a_frame_larger_than_the_frame_size_is_refused_from_its_header() -> None:
    sink = Sink()
    frames = reader(sink)
    frames.read(memoryview(PREFACE + (16_385).to_bytes(3, "big") + bytes([DATA, 0]) + (1).to_bytes(4, "big")))
    assert sink.errors == [ErrorCodes.FRAME_SIZE_ERROR]


def test_a_stream_beyond_the_room_is_refused_after_its_field_block_is_decoded() -> None:
    encoder = Encoder()
    sink = Sink(room=1)
    frames = reader(sink)
    first = frame(HEADERS, END_HEADERS, 1, encoder.encode([(":path", "/a")]))
    block = encoder.encode([(":path", "/b"), ("x-marker", "in-the-dynamic-table")])
    extra = frame(HEADERS, PADDED, 3, b"\x02" + block[:5] + b"\x00\x00") + frame(
        CONTINUATION, END_HEADERS, 3, block[5:]
    )
    late = frame(DATA, 0, 3, b"y" * 10) + frame(RST_STREAM, 0, 3, b"\x00\x00\x00\x08")
    sink.room = 1
    read_all(frames, PREFACE + first)
    sink.room = 0  # the first stream is still open
    read_all(frames, extra + late + frame(PING, 0, 0, b"\x00" * 8))
    assert sink.blocks == [block]
    assert sink.refused == [3]
    assert sink.windows == [10]  # the dropped DATA's share of the connection window
    assert bytes(sink.fed) == PREFACE + first + frame(PING, 0, 0, b"\x00" * 8)  # nothing of stream 3 reached h2


def test_a_refused_block_interrupted_by_another_frame_is_a_protocol_error() -> None:
    sink = Sink(room=0)
    frames = reader(sink)
    read_all(frames, PREFACE + frame(HEADERS, 0, 1, b"\x82") + frame(PING, 0, 0, b"\x00" * 8))
    assert sink.errors == [ErrorCodes.PROTOCOL_ERROR] and not sink.refused


def test_outbound_frames_are_counted_only_while_the_socket_takes_no_more() -> None:
    outbound = OutboundFrames(replace(LIMITS, max_outbound_frames=3, max_outbound_control_frames=2))
    assert outbound.written(frame(PING, ACK, 0, b"\x00" * 8) * 10) is None
    outbound.pause()
    assert outbound.written(frame(DATA, 0, 1, b"x") + frame(PING, ACK, 0, b"\x00" * 8) * 2) is None
    assert outbound.written(frame(RST_STREAM, 0, 1, b"\x00\x00\x00\x07")) is Limit.OUTBOUND_CONTROL_FRAMES
    outbound.resume()
    outbound.pause()
    assert outbound.written(frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x01") * 4) is Limit.OUTBOUND_FRAMES
    assert outbound.data_frames == 1


def test_data_frames_are_counted_in_every_write_whatever_their_length() -> None:
    """The WINDOW_UPDATE allowance grows with the DATA frames sent: each is counted, paused or not, the frame
    lengths (24 bits) read right past 255 and 65,535 bytes."""
    outbound = OutboundFrames(LIMITS)
    big, bigger = frame(DATA, 0, 1, b"x" * 300), frame(DATA, 0, 3, b"y" * 70_000)
    assert outbound.written(frame(HEADERS, END_HEADERS, 1, b"\x88") + big + bigger + frame(DATA, 0, 5, b"")) is None
    assert outbound.data_frames == 3 and outbound.frames == 0
    outbound.pause()
    assert outbound.written(memoryview(big + frame(PING, ACK, 0, b"\x00" * 8))) is None
    assert (outbound.data_frames, outbound.frames, outbound.control_frames) == (4, 2, 1)


def test_the_token_bucket_allows_a_burst_then_the_rate() -> None:
    now = [100.0]
    bucket = TokenBucket(3, 10.0, lambda: now[0])
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    now[0] += 0.25  # two and a half more
    assert [bucket.take() for _ in range(3)] == [True, True, False]


def test_the_limits_come_from_the_grpc_settings_and_the_header_size() -> None:
    settings = GrpcSettings(max_concurrent_streams=7, idle_timeout_secs=3.0, max_outbound_frames=11)
    limits = Http2Limits.of(settings, max_header_bytes=4096)
    assert (limits.max_concurrent_streams, limits.idle_timeout_secs, limits.max_outbound_frames) == (7, 3.0, 11)
    assert limits.max_header_bytes == 4096
    assert Http2Limits.of(GrpcSettings(), max_header_bytes=65_536) == Http2Limits()
