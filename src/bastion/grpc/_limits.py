"""What one HTTP/2 connection may make the server do: the limits, read once from ``[grpc]``, and token buckets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from bastion.config import GrpcSettings

RESET_BURST = 500
"""RST_STREAM frames a client may send at once before the rate applies (CVE-2023-44487, "rapid reset")."""
RESETS_PER_SEC = 100.0
"""Sustained RST_STREAM frames per second a connection may send; beyond, GOAWAY ENHANCE_YOUR_CALM and close."""


class Limit(Enum):
    """A limit a connection went past (the ``limit`` of the ``http2_flood`` log line): its config key."""

    INBOUND_CONTROL_FRAMES = "max_inbound_control_frames_per_sec"
    EMPTY_FRAMES = "max_consecutive_inbound_frames_with_empty_payload"
    PRIORITY_FRAMES = "max_inbound_priority_frames_per_stream"
    WINDOW_UPDATE_FRAMES = "max_inbound_window_update_frames_per_data_frame_sent"
    HEADER_BLOCK = "max_header_bytes"
    OUTBOUND_FRAMES = "max_outbound_frames"
    OUTBOUND_CONTROL_FRAMES = "max_outbound_control_frames"
    STREAM_RESETS = "stream_resets"


@dataclass(frozen=True, slots=True, kw_only=True)
class Http2Limits:
    """The HTTP/2 limits every connection gets (main port and ``grpc.port``); docs/grpc.md "Limits".

    The flood limits carry Envoy's names and defaults. ``max_header_bytes`` is ``service.max_header_bytes``:
    the largest field block (HEADERS plus CONTINUATION payloads) a client may send.
    """

    max_concurrent_streams: int = 100
    idle_timeout_secs: float = 60.0
    keepalive_interval_secs: float = 0.0
    keepalive_timeout_secs: float = 20.0
    max_outbound_frames: int = 10_000
    max_outbound_control_frames: int = 1_000
    max_inbound_control_frames_per_sec: float = 100.0
    max_consecutive_inbound_frames_with_empty_payload: int = 1
    max_inbound_priority_frames_per_stream: int = 100
    max_inbound_window_update_frames_per_data_frame_sent: int = 10
    max_header_bytes: int = 65_536

    @classmethod
    def of(cls, grpc: GrpcSettings, *, max_header_bytes: int) -> Http2Limits:
        """From the ``[grpc]`` settings and ``service.max_header_bytes``."""
        return cls(
            max_concurrent_streams=grpc.max_concurrent_streams,
            idle_timeout_secs=grpc.idle_timeout_secs,
            keepalive_interval_secs=grpc.keepalive_interval_secs,
            keepalive_timeout_secs=grpc.keepalive_timeout_secs,
            max_outbound_frames=grpc.max_outbound_frames,
            max_outbound_control_frames=grpc.max_outbound_control_frames,
            max_inbound_control_frames_per_sec=grpc.max_inbound_control_frames_per_sec,
            max_consecutive_inbound_frames_with_empty_payload=grpc.max_consecutive_inbound_frames_with_empty_payload,
            max_inbound_priority_frames_per_stream=grpc.max_inbound_priority_frames_per_stream,
            max_inbound_window_update_frames_per_data_frame_sent=(
                grpc.max_inbound_window_update_frames_per_data_frame_sent
            ),
            max_header_bytes=max_header_bytes,
        )


DEFAULT_LIMITS = Http2Limits()


class TokenBucket:
    """``burst`` tokens at once, refilled at ``per_sec``; :meth:`take` spends one or says there is none."""

    __slots__ = ("_clock", "_stamp", "_tokens", "burst", "per_sec")

    def __init__(self, burst: float, per_sec: float, clock: Callable[[], float]) -> None:
        self.burst = float(burst)
        self.per_sec = per_sec
        self._clock = clock
        self._tokens = self.burst
        self._stamp = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.per_sec)
        self._stamp = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


def reset_budget(clock: Callable[[], float]) -> TokenBucket:
    """Stream resets a connection may cause: ``RESET_BURST`` at once, ``RESETS_PER_SEC`` after.

    Each reset stream cost the server a call it started and cancelled (or, refused, a field block it decoded);
    a client opening and resetting streams in a loop makes the server work without ever being limited by
    ``max_concurrent_streams``. Legitimate clients cancel calls too (deadlines), far below this rate.
    """
    return TokenBucket(RESET_BURST, RESETS_PER_SEC, clock)
