"""Client-side measuring tools the scenarios share: a process's memory and open files, raw HTTP/2 frames,
legitimate requests timed while an attack runs, and attack connections that record when the server closed them."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from grpclib.client import Channel
from hpack import Encoder

from examples.documents_api.proto.documents.v1 import documents_grpc, documents_pb2

ATTACKER = "127.0.0.2"
"""The source address of the attack connections of the listener and HTTP/2 flood scenarios (DESIGN 5b)."""
LEGIT = "127.0.0.1"
"""The source address of the legitimate client beside them: the per-address cap must not touch it."""

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x2, 0x3, 0x4, 0x6, 0x7
WINDOW_UPDATE, CONTINUATION = 0x8, 0x9
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x2, 0x4, 0x5
H2_ERRORS = {
    0x0: "NO_ERROR",
    0x1: "PROTOCOL_ERROR",
    0x2: "INTERNAL_ERROR",
    0x6: "FRAME_SIZE_ERROR",
    0x7: "REFUSED_STREAM",
    0x9: "COMPRESSION_ERROR",
    0xB: "ENHANCE_YOUR_CALM",
}
NO_GOAWAY = -1
"""What a GOAWAY figure shows when the server closed the connection without one."""


def goaway_note(code: int | None, expected: int) -> str:
    """The note beside a GOAWAY code figure: what came, what was wanted."""
    want = f"want {H2_ERRORS[expected]}"
    if code is None:
        return f"connection left open, no GOAWAY; {want}"
    if code == NO_GOAWAY:
        return f"closed without GOAWAY; {want}"
    return f"got {H2_ERRORS.get(code, hex(code))}; {want}"


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a live process (Linux ``/proc``); None elsewhere."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


@dataclass(slots=True)
class Served:
    """Legitimate requests made while an attack ran: how many, how many answered as they should, the slowest."""

    sent: int = 0
    ok: int = 0
    latencies: list[float] = field(default_factory=list)

    @property
    def slowest(self) -> float | None:
        return max(self.latencies) if self.latencies and self.ok == self.sent else None

    def percentile(self, q: float) -> float | None:
        """The ``q`` percentile (nearest rank) of the answered requests' latencies; None when none answered."""
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


async def keep_probing(
    probe: Callable[[], Awaitable[bool]], served: Served, stop: asyncio.Event, interval: float
) -> None:
    """Run ``probe`` (True = answered correctly) every ``interval`` seconds until ``stop``; each bounded by 5 s."""
    while not stop.is_set():
        started = time.perf_counter()
        served.sent += 1
        try:
            ok = await asyncio.wait_for(probe(), 5.0)
        except Exception:  # a failed legitimate request is what the figure counts
            ok = False
        if ok:
            served.ok += 1
            served.latencies.append(time.perf_counter() - started)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)


async def once(probe: Callable[[], Awaitable[bool]], within: float = 5.0) -> bool:
    """One run of ``probe``: True when it answered as it should within ``within`` seconds (an error is a no)."""
    try:
        return await asyncio.wait_for(probe(), within)
    except Exception:  # a failed legitimate request is what the figure counts
        return False


def http_probe(url: str, headers: dict[str, str]) -> Callable[[], Awaitable[bool]]:
    """A GET on a fresh connection that must answer 200."""

    async def probe() -> bool:
        async with httpx.AsyncClient(timeout=5.0) as client:
            return (await client.get(url, headers=headers)).status_code == 200

    return probe


def grpc_probe(port: int, token: str) -> Callable[[], Awaitable[bool]]:
    """One ListDocuments call of the example over a fresh grpclib channel, which must succeed."""

    async def probe() -> bool:
        channel = Channel("127.0.0.1", port)
        try:
            stub = documents_grpc.DocumentServiceStub(channel)
            reply = await stub.ListDocuments(
                documents_pb2.ListDocumentsRequest(), metadata={"authorization": f"Bearer {token}"}, timeout=5.0
            )
            return len(reply.items) > 0
        finally:
            channel.close()

    return probe


async def open_from(source: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to ``port`` on 127.0.0.1 from the address ``source`` (bound before the connect)."""
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


def connect_from(source: str, port: int, timeout: float = 5.0) -> socket.socket:
    """A blocking socket connected to ``port`` on 127.0.0.1 from ``source`` (bound before the connect)."""
    return socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))


def health_probe(port: int, source: str = LEGIT) -> Callable[[], Awaitable[bool]]:
    """``GET /health`` on a fresh connection from ``source``, which must answer 200: raw bytes, so that a probe
    loop measures the server and not the client library."""
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"

    async def probe() -> bool:
        reader, writer = await open_from(source, port)
        try:
            writer.write(request)
            await writer.drain()
            return status_of(await reader.read()) == 200
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    return probe


@dataclass(slots=True)
class Attack:
    """What happened to one attack connection: seconds until the server closed it (None: still open at the end)
    and the bytes the server sent."""

    closed_after: float | None = None
    received: bytes = b""


async def attack_connection(
    port: int,
    first: bytes,
    drip: bytes,
    *,
    interval: float,
    limit: float,
    on_open: Callable[[], None] | None = None,
    source: str | None = None,
) -> Attack:
    """Open a connection (from the address ``source`` when given), send ``first``, then ``drip`` every ``interval``
    seconds until the server closes it or ``limit`` seconds pass; the connection is closed by us at the end either
    way."""
    result = Attack()
    if source is None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    else:
        reader, writer = await open_from(source, port)
    started = time.perf_counter()
    if on_open is not None:
        on_open()

    async def dripping() -> None:
        with contextlib.suppress(ConnectionError, OSError):
            if first:
                writer.write(first)
                await writer.drain()
            while drip:
                await asyncio.sleep(interval)
                writer.write(drip)
                await writer.drain()

    async def reading() -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await reader.read(65536):
                result.received += chunk
        result.closed_after = time.perf_counter() - started

    sender = asyncio.create_task(dripping())
    try:
        await asyncio.wait_for(reading(), limit)
    except TimeoutError:
        result.closed_after = None
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()
    return result


def status_of(response: bytes) -> int | None:
    """The status code of the first HTTP/1.1 response in ``response``."""
    if not response.startswith(b"HTTP/1."):
        return None
    try:
        return int(response.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def frame(kind: int, flags: int, stream: int, payload: bytes = b"", *, length: int | None = None) -> bytes:
    size = len(payload) if length is None else length
    return struct.pack(">I", size)[1:] + bytes([kind, flags]) + struct.pack(">I", stream & 0x7FFFFFFF) + payload


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, int, int, bytes]:
    head = await reader.readexactly(9)
    size = int.from_bytes(head[:3], "big")
    stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
    return head[3], head[4], stream, await reader.readexactly(size)


class H2Connection:
    """A raw HTTP/2 client connection past the handshake (preface, both SETTINGS, the ACK)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_frame_size: int) -> None:
        self.reader = reader
        self.writer = writer
        self.max_frame_size = max_frame_size

    @classmethod
    async def open(cls, port: int, within: float = 5.0, *, source: str | None = None) -> H2Connection:
        if source is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        else:
            reader, writer = await open_from(source, port)
        writer.write(PREFACE + frame(SETTINGS, 0, 0))
        await writer.drain()
        max_frame_size = 16_384
        while True:
            kind, flags, _stream, payload = await asyncio.wait_for(read_frame(reader), within)
            if kind == SETTINGS and not flags & ACK:
                for offset in range(0, len(payload), 6):
                    ident, value = struct.unpack(">HI", payload[offset : offset + 6])
                    if ident == SETTINGS_MAX_FRAME_SIZE:
                        max_frame_size = value
                writer.write(frame(SETTINGS, ACK, 0))
                await writer.drain()
                return cls(reader, writer, max_frame_size)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def goaway(self, within: float) -> int | None:
        """The error code of the server's GOAWAY; NO_GOAWAY when it closed without one; None if it did neither."""
        try:
            async with asyncio.timeout(within):
                while True:
                    kind, _flags, _stream, payload = await read_frame(self.reader)
                    if kind == GOAWAY:
                        return int.from_bytes(payload[4:8], "big")
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            return NO_GOAWAY
        except TimeoutError:
            return None

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


def grpc_request_fields(port: int, token: str, method: str = "ListDocuments") -> list[tuple[str, str]]:
    """The header fields of a valid gRPC request of the example's DocumentService."""
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", f"/documents.v1.DocumentService/{method}"),
        (":authority", f"127.0.0.1:{port}"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("authorization", f"Bearer {token}"),
    ]


def grpc_request_headers(port: int, token: str) -> bytes:
    """An HPACK block of a valid gRPC request (ListDocuments), for the rapid-reset burst."""
    return bytes(Encoder().encode(grpc_request_fields(port, token)))


def take_frames(buffer: bytearray) -> list[tuple[int, int, int, bytes]]:
    """The complete HTTP/2 frames at the start of ``buffer`` (type, flags, stream, payload), removed from it."""
    frames = []
    offset = 0
    while len(buffer) - offset >= 9:
        size = int.from_bytes(buffer[offset : offset + 3], "big")
        if len(buffer) - offset < 9 + size:
            break
        stream = int.from_bytes(buffer[offset + 5 : offset + 9], "big") & 0x7FFFFFFF
        kind, flags = buffer[offset + 3], buffer[offset + 4]
        frames.append((kind, flags, stream, bytes(buffer[offset + 9 : offset + 9 + size])))
        offset += 9 + size
    del buffer[:offset]
    return frames


async def peak_rss(pid: int, stop: asyncio.Event, interval: float = 0.05) -> int | None:
    """The highest resident memory of ``pid`` seen every ``interval`` seconds until ``stop`` is set."""
    peak = rss_bytes(pid)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
        now = rss_bytes(pid)
        if now is not None and (peak is None or now > peak):
            peak = now
    return peak
