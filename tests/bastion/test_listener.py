"""The listener: the first-bytes sniffer (HTTP/1.1 to uvicorn, HTTP/2 preface to gRPC) and its limits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from fastapi import WebSocket
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
from uvicorn.server import ServerState

from bastion import Service, load_settings
from bastion import _listener as server_module
from bastion._connections import UNCOUNTED, Slot
from bastion._listener import (
    GOAWAY_PROTOCOL_ERROR,
    H2_PREFACE,
    HEADERS_TOO_LARGE_RESPONSE,
    TOO_MANY_CONNECTIONS_RESPONSE,
    TOO_MANY_FROM_ADDRESS_RESPONSE,
    ListenerConfig,
    ListenerLimits,
    SniffingProtocol,
    WebSocketProtocol,
)
from bastion._listener import _sniffer as sniffer_module
from bastion._runner import uvicorn_config
from tests.conftest import TOKEN_OFF

SETTINGS_FRAME = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
# The listener's own answers, byte for byte (the e2e tests compare against these too).
HEADERS_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: application/json\r\n"
    b"content-length: 83\r\n"
    b"connection: close\r\n"
    b"\r\n"
    b'{"error":"Request header fields too large","code":"HEADERS_TOO_LARGE","status":431}'
)
TOO_MANY_CONNECTIONS = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"content-type: application/json\r\n"
    b"content-length: 95\r\n"
    b"retry-after: 1\r\n"
    b"connection: close\r\n"
    b"\r\n"
    b'{"error":"Service unavailable: too many connections","code":"SERVICE_UNAVAILABLE","status":503}'
)
TOO_MANY_FROM_ADDRESS = (
    b"HTTP/1.1 429 Too Many Requests\r\n"
    b"content-type: application/json\r\n"
    b"content-length: 108\r\n"
    b"retry-after: 1\r\n"
    b"connection: close\r\n"
    b"\r\n"
    b'{"error":"Too many connections from this address","code":"RATE_LIMIT_EXCEEDED","status":429,"retry_after":1}'
)
# Small limits so that the cases stay small and fast.
LIMITS_ENV = {
    "SERVICE_MAX_HEADER_BYTES": "2048",
    "SERVICE_MAX_HEADERS": "10",
    "SERVICE_HEADER_READ_TIMEOUT_SECS": "0.3",
}


def app_service() -> Service:
    service = Service("sniff")
    service.version(1).get("/x")(lambda: {"ok": True})
    return service


class Listener:
    """Starts servers of a sniffing protocol on loopback (all share one uvicorn ``ServerState``) and opens
    client connections to them; the fixture closes both."""

    def __init__(self) -> None:
        self.state = ServerState()
        self.configs: list[ListenerConfig] = []
        self.servers: list[asyncio.Server] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def __call__(
        self,
        protocol: type[SniffingProtocol],
        *,
        environ: dict[str, str] | None = None,
        service: Service | None = None,
    ) -> asyncio.Server:
        settings = load_settings(environ={**TOKEN_OFF, **(environ or {})})
        config = uvicorn_config((service or app_service()).build(settings), settings, host="127.0.0.1", port=0)
        config.load()
        assert isinstance(config, ListenerConfig)
        self.configs.append(config)
        server = await asyncio.get_running_loop().create_server(
            lambda: protocol(config=config, server_state=self.state, app_state={}), "127.0.0.1", 0
        )
        self.servers.append(server)
        return server

    async def connect(
        self, server: asyncio.Server, *, source: str = "127.0.0.1"
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A client connection from loopback address ``source`` (127.0.0.2 plays the other client)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server), local_addr=(source, 0))
        self.writers.append(writer)
        return reader, writer


@pytest.fixture
async def serve() -> AsyncIterator[Listener]:
    listener = Listener()
    yield listener
    for writer in listener.writers:
        await close(writer)
    for server in listener.servers:
        server.close()
    for connection in list(listener.state.connections):
        connection.shutdown()
    for server in listener.servers:
        await server.wait_closed()


def port_of(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):  # the server may have reset a socket the test still wrote to
        await writer.wait_closed()


async def exchange(port: int, payload: bytes, *, pause_after: int | None = None) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if pause_after is None:
            writer.write(payload)
        else:
            writer.write(payload[:pause_after])
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(payload[pause_after:])
        await writer.drain()
        return await asyncio.wait_for(reader.read(65536), timeout=10)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_http11_goes_to_uvicorn(serve: Listener) -> None:
    server = await serve(SniffingProtocol)
    reply = await exchange(port_of(server), b"GET /api/v1/x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200")
    assert reply.endswith(b'{"ok":true}')


async def test_request_split_inside_the_sniffed_prefix(serve: Listener) -> None:
    """'P' could start POST or PRI: the sniffer waits for the next byte, then hands over everything."""
    server = await serve(SniffingProtocol)
    reply = await exchange(
        port_of(server), b"PUT /api/v1/x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", pause_after=1
    )
    assert reply.startswith(b"HTTP/1.1 405")


async def test_http2_preface_is_closed_without_grpc(serve: Listener) -> None:
    server = await serve(SniffingProtocol)
    assert await exchange(port_of(server), H2_PREFACE + SETTINGS_FRAME) == b""


async def test_http2_preface_goes_to_the_h2_factory(serve: Listener) -> None:
    received: list[bytes] = []

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            received.append(data)
            self.transport.write(b"h2:" + data)  # type: ignore[attr-defined]
            self.transport.close()

    class WithH2(SniffingProtocol):
        h2_protocol_factory = Echo

    server = await serve(WithH2)
    reply = await exchange(port_of(server), H2_PREFACE + SETTINGS_FRAME, pause_after=10)
    assert reply == b"h2:" + H2_PREFACE + SETTINGS_FRAME
    assert received == [H2_PREFACE + SETTINGS_FRAME]


async def test_garbage_after_the_preface_gets_goaway_and_close(serve: Listener) -> None:
    class WithH2(SniffingProtocol):
        h2_protocol_factory = asyncio.Protocol

    server = await serve(WithH2)
    for garbage in (b"\xff" * 64, b"\x00\x00\x04\x01\x00\x00\x00\x00\x01abcd", b"garbage-garbage"):
        assert await exchange(port_of(server), H2_PREFACE + garbage) == GOAWAY_PROTOCOL_ERROR


async def test_half_sent_preface_then_silence_is_closed(serve: Listener, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sniffer_module, "SNIFF_TIMEOUT_SECS", 0.2)
    server = await serve(SniffingProtocol)
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
    writer.write(H2_PREFACE[:10])
    await writer.drain()
    assert await asyncio.wait_for(reader.read(1024), timeout=10) == b""
    writer.close()
    await writer.wait_closed()


def head_of_size(size: int, *, path: bytes = b"/api/v1/x") -> bytes:
    """A canonical GET head of exactly ``size`` bytes (request line, two headers, final CRLF)."""
    start = b"GET " + path + b" HTTP/1.1\r\nHost: t\r\nX-Pad: "
    return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"


async def read_to_eof(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), timeout=10)


async def wait_until(condition: Callable[[], bool]) -> None:
    """Poll for up to 10 s: uvicorn's connection set has no event to wait on."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached within 10 s")


def test_431_response_is_the_error_shape_with_connection_close() -> None:
    assert HEADERS_TOO_LARGE_RESPONSE == HEADERS_TOO_LARGE


def test_connection_refusal_is_a_503_in_the_error_shape() -> None:
    assert TOO_MANY_CONNECTIONS_RESPONSE == TOO_MANY_CONNECTIONS


def test_refusal_per_address_is_a_429_in_the_error_shape() -> None:
    assert TOO_MANY_FROM_ADDRESS_RESPONSE == TOO_MANY_FROM_ADDRESS


def test_uvicorn_config_carries_the_listener_limits() -> None:
    settings = load_settings(
        environ={
            **TOKEN_OFF,
            **LIMITS_ENV,
            "SERVICE_KEEP_ALIVE_TIMEOUT_SECS": "1.5",
            "SERVICE_MAX_CONNECTIONS": "7",
        }
    )
    config = uvicorn_config(app_service().build(settings), settings, host="127.0.0.1", port=0)
    assert config.limits == ListenerLimits(  # type: ignore[attr-defined]
        max_header_bytes=2048,
        max_headers=10,
        header_read_timeout_secs=0.3,
        max_connections=7,
        max_connections_per_ip=256,
        max_pipelined_requests=32,
    )
    assert config.timeout_keep_alive == math.ceil(1.5)
    assert config.limit_concurrency is None


async def test_head_of_exactly_max_header_bytes_is_served(serve: Listener) -> None:
    server = await serve(SniffingProtocol, environ=LIMITS_ENV)
    reader, writer = await serve.connect(server)
    writer.write(head_of_size(2048))
    reply = await asyncio.wait_for(reader.readuntil(b'{"ok":true}'), timeout=10)
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")


async def test_head_one_byte_over_max_header_bytes_gets_431_and_close(serve: Listener) -> None:
    server = await serve(SniffingProtocol, environ=LIMITS_ENV)
    reader, writer = await serve.connect(server)
    writer.write(head_of_size(2049))
    assert await read_to_eof(reader) == HEADERS_TOO_LARGE


async def test_long_request_target_counts_toward_max_header_bytes(serve: Listener) -> None:
    server = await serve(SniffingProtocol, environ=LIMITS_ENV)
    reader, writer = await serve.connect(server)
    writer.write(b"GET /api/v1/x?q=" + b"a" * 2100 + b" HTTP/1.1\r\nHost: t\r\n\r\n")
    assert await read_to_eof(reader) == HEADERS_TOO_LARGE


async def test_max_headers_headers_are_served(serve: Listener) -> None:
    server = await serve(SniffingProtocol, environ=LIMITS_ENV)
    reader, writer = await serve.connect(server)
    headers = b"".join(b"X-%d: v\r\n" % i for i in range(8))  # with Host and Connection: 10
    writer.write(b"GET /api/v1/x HTTP/1.1\r\nHost: t\r\n" + headers + b"Connection: close\r\n\r\n")
    reply = await read_to_eof(reader)
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")


async def test_one_header_more_than_max_headers_gets_431(serve: Listener) -> None:
    server = await serve(SniffingProtocol, environ=LIMITS_ENV)
    reader, writer = await serve.connect(server)
    headers = b"".join(b"X-%d: v\r\n" % i for i in range(10))  # with Host: 11
    writer.write(b"GET /api/v1/x HTTP/1.1\r\nHost: t\r\n" + headers + b"\r\n")
    assert await read_to_eof(reader) == HEADERS_TOO_LARGE


async def test_unfinished_header_is_refused_once_its_bytes_pass_the_limit(serve: Listener) -> None:
    """The header line never ends: the bytes received, not the parsed header, trigger the 431."""
    server = await serve(SniffingProtocol, environ=LIMITS_ENV)
    reader, writer = await serve.connect(server)
    writer.write(b"GET /api/v1/x HTTP/1.1\r\nHost: t\r\nX-Big: ")
    await writer.drain()
    for _ in range(3):
        writer.write(b"a" * 1000)
        await writer.drain()
        await asyncio.sleep(0.02)
    assert await read_to_eof(reader) == HEADERS_TOO_LARGE


async def test_431_for_a_pipelined_head_follows_the_earlier_response(serve: Listener) -> None:
    server = await serve(SniffingProtocol, environ=LIMITS_ENV)
    reader, writer = await serve.connect(server)
    writer.write(b"GET /api/v1/x HTTP/1.1\r\nHost: t\r\n\r\n" + head_of_size(4000))
    reply = await read_to_eof(reader)
    first, _, rest = reply.partition(b'{"ok":true}')
    assert first.startswith(b"HTTP/1.1 200 OK\r\n")
    assert rest == HEADERS_TOO_LARGE


async def test_half_sent_head_is_closed_after_header_read_timeout(serve: Listener) -> None:
    server = await serve(SniffingProtocol, environ=LIMITS_ENV)
    reader, writer = await serve.connect(server)
    writer.write(b"GET /api/v1/x HTTP/1.1\r\nHost: t\r\nX-Slow: abc")
    assert await read_to_eof(reader) == b""


async def test_trickled_head_is_closed_at_its_deadline_not_kept_alive_by_each_byte(serve: Listener) -> None:
    server = await serve(SniffingProtocol, environ=LIMITS_ENV)
    reader, writer = await serve.connect(server)
    writer.write(b"GET /api/v1/x HTTP/1.1\r\nHost: t\r\nX-Slow: ")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not reader.at_eof():
        assert loop.time() < deadline, "the trickled head was never closed"
        writer.write(b"a")
        try:
            assert await asyncio.wait_for(reader.read(1024), timeout=0.05) == b""
        except TimeoutError:
            continue


async def test_silent_connection_is_closed_after_header_read_timeout(serve: Listener) -> None:
    server = await serve(SniffingProtocol, environ=LIMITS_ENV)
    reader, _ = await serve.connect(server)
    assert await read_to_eof(reader) == b""


async def test_second_request_on_a_kept_alive_connection_has_a_header_deadline(serve: Listener) -> None:
    server = await serve(SniffingProtocol, environ={**LIMITS_ENV, "SERVICE_KEEP_ALIVE_TIMEOUT_SECS": "60"})
    reader, writer = await serve.connect(server)
    writer.write(b"GET /api/v1/x HTTP/1.1\r\nHost: t\r\n\r\n")
    first = await asyncio.wait_for(reader.readuntil(b'{"ok":true}'), timeout=10)
    assert first.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"connection: close" not in first
    writer.write(b"GET /api/v1/x HTTP/1.1\r\nHost: t\r\nX-Slow: abc")
    assert await read_to_eof(reader) == b""


async def test_connection_over_max_connections_gets_503_until_one_closes(serve: Listener) -> None:
    server = await serve(SniffingProtocol, environ={"SERVICE_MAX_CONNECTIONS": "2"})
    port = port_of(server)
    held = [await serve.connect(server), await serve.connect(server)]
    await wait_until(lambda: len(serve.state.connections) == 2)
    reader, writer = await serve.connect(server)
    writer.write(b"GET /api/v1/x HTTP/1.1\r\nHost: t\r\n\r\n")
    assert await read_to_eof(reader) == TOO_MANY_CONNECTIONS
    for _, held_writer in held:
        await close(held_writer)
    await wait_until(lambda: not serve.state.connections)
    reply = await exchange(port, b"GET /api/v1/x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")


async def test_http2_preface_over_max_connections_is_closed(serve: Listener) -> None:
    class WithH2(SniffingProtocol):
        h2_protocol_factory = asyncio.Protocol

    server = await serve(WithH2, environ={"SERVICE_MAX_CONNECTIONS": "1"})
    port = port_of(server)
    await serve.connect(server)
    await wait_until(lambda: len(serve.state.connections) == 1)
    assert await exchange(port, H2_PREFACE + SETTINGS_FRAME) == b""


async def test_shutdown_closes_connections_still_being_sniffed(serve: Listener) -> None:
    server = await serve(SniffingProtocol)
    reader, _ = await serve.connect(server)
    await wait_until(lambda: len(serve.state.connections) == 1)
    for connection in list(serve.state.connections):
        connection.shutdown()
    assert await read_to_eof(reader) == b""


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False


def coalescing_cycle(
    method: str = "GET", cycle_class: type[RequestResponseCycle] = server_module.CoalescingCycle
) -> tuple[Any, RecordingTransport]:
    transport = RecordingTransport()
    cycle = cycle_class(
        scope={"type": "http", "method": method, "http_version": "1.1", "headers": []},  # type: ignore[typeddict-item]
        transport=transport,  # type: ignore[arg-type]
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test"),
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=True,
        on_response=lambda: None,
    )
    cycle.more_body = False  # the request has been read whole (uvicorn sets this at the message's end)
    return cycle, transport


FIXED_HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n"
FIXED_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-length", b"2"), (b"content-type", b"application/json")],
}


async def test_a_fixed_length_response_leaves_in_one_write() -> None:
    cycle, transport = coalescing_cycle()
    await cycle.send(FIXED_START)
    assert transport.writes == []  # held until the body
    await cycle.send({"type": "http.response.body", "body": b"{}"})
    assert transport.writes == [FIXED_HEAD + b"{}"]
    assert cycle.response_complete


async def test_a_fixed_length_body_in_several_messages_keeps_uvicorns_framing() -> None:
    cycle, transport = coalescing_cycle()
    await cycle.send(FIXED_START)
    await cycle.send({"type": "http.response.body", "body": b"{", "more_body": True})
    await cycle.send({"type": "http.response.body", "body": b"}"})
    assert b"".join(transport.writes) == FIXED_HEAD + b"{}" and transport.writes[0] == FIXED_HEAD + b"{"


async def test_a_head_request_gets_its_head_at_start() -> None:
    cycle, transport = coalescing_cycle("HEAD")
    await cycle.send(FIXED_START)
    assert transport.writes == [FIXED_HEAD]
    await cycle.send({"type": "http.response.body", "body": b""})
    assert transport.writes == [FIXED_HEAD]


async def test_a_streamed_response_has_its_head_written_at_start() -> None:
    """No content-length (chunked: server-sent events, streams): the client sees the head before any chunk."""
    cycle, transport = coalescing_cycle()
    await cycle.send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    assert transport.writes == [b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n"]
    await cycle.send({"type": "http.response.body", "body": b"hi"})
    assert transport.writes[1:] == [b"2\r\nhi\r\n0\r\n\r\n"]


async def test_a_body_longer_than_declared_still_fails_as_in_uvicorn_with_the_head_written() -> None:
    cycle, transport = coalescing_cycle()
    await cycle.send(FIXED_START)
    with pytest.raises(RuntimeError, match="longer than Content-Length"):
        await cycle.send({"type": "http.response.body", "body": b"{}!"})
    assert transport.writes == [FIXED_HEAD]


async def test_closing_after_the_response_comes_after_its_bytes() -> None:
    """``connection: close``: uvicorn closes the transport as the body completes; the bytes leave first."""
    written = []
    for cycle_class in (RequestResponseCycle, server_module.CoalescingCycle):
        cycle, transport = coalescing_cycle(cycle_class=cycle_class)
        cycle.keep_alive = False
        closed: list[int] = []
        transport.close = lambda: closed.append(len(transport.writes))  # type: ignore[attr-defined]  # noqa: B023
        await cycle.send(FIXED_START)
        await cycle.send({"type": "http.response.body", "body": b"{}"})
        assert closed == [len(transport.writes)]
        written.append(transport.writes)
    uvicorns, coalesced = written
    # uvicorn's bytes (with ``connection: close`` from uvicorn 0.53 on), in one write.
    assert coalesced == [b"".join(uvicorns)] and len(uvicorns) == 2


async def test_served_connections_use_the_coalescing_cycle(serve: Listener) -> None:
    reader, writer = await serve.connect(await serve(SniffingProtocol))
    writer.write(b"GET /api/v1/x HTTP/1.1\r\nhost: t\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    (protocol,) = [p for p in serve.state.connections if isinstance(p, server_module.BoundedHttpProtocol)]
    assert type(protocol.cycle) is server_module.CoalescingCycle


PIPELINE_ENV = {"SERVICE_MAX_PIPELINED_REQUESTS": "4", "SERVICE_RATE_LIMIT_ENABLED": "false"}


def held_service(release: asyncio.Event, started: list[int]) -> Service:
    """``GET /api/v1/held/{n}`` waits for ``release`` (recording ``n`` in ``started``), then answers ``{"n": n}``;
    ``POST /api/v1/size`` answers how many characters its JSON body's ``data`` has."""
    service = Service("held")

    async def held(n: int) -> dict[str, int]:
        started.append(n)
        await release.wait()
        return {"n": n}

    async def size(payload: dict[str, str]) -> dict[str, int]:
        return {"size": len(payload["data"])}

    v1 = service.version(1)
    v1.get("/held/{n}")(held)
    v1.post("/size")(size)
    return service


async def read_responses(reader: asyncio.StreamReader, count: int) -> list[bytes]:
    """``count`` responses with a content-length, each as its body."""
    bodies = []
    for _ in range(count):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        bodies.append(await asyncio.wait_for(reader.readexactly(length), timeout=10))
    return bodies


def http11_connections(serve: Listener) -> list[server_module.BoundedHttpProtocol]:
    return [p for p in serve.state.connections if isinstance(p, server_module.BoundedHttpProtocol)]


async def held_input(serve: Listener) -> server_module.BoundedHttpProtocol:
    """The one HTTP/1.1 connection, once it holds input unparsed."""
    await wait_until(lambda: any(p.gate.held for p in http11_connections(serve)))
    (protocol,) = http11_connections(serve)
    return protocol


async def test_parsing_stops_at_max_pipelined_requests_and_resumes_as_the_queue_drains(serve: Listener) -> None:
    """20 pipelined requests of one parse slice each, the first one held in its handler: exactly 4
    (``max_pipelined_requests``) are parsed and queued behind it, the rest waits unparsed with the transport paused;
    released, all 20 are answered in order on the same connection."""
    release, started = asyncio.Event(), []
    server = await serve(SniffingProtocol, environ=PIPELINE_ENV, service=held_service(release, started))
    reader, writer = await serve.connect(server)
    size = server_module.PARSE_SLICE_BYTES
    writer.write(b"".join(head_of_size(size, path=b"/api/v1/held/%d" % n) for n in range(20)))
    protocol = await held_input(serve)
    await asyncio.sleep(0.05)  # anything more the server would parse, it would have parsed by now
    assert started == [0]
    assert len(protocol.pipeline) == 4
    assert protocol.gate.read_paused or protocol.gate.held
    release.set()
    bodies = await read_responses(reader, 20)
    assert bodies == [b'{"n":%d}' % n for n in range(20)]
    assert started == list(range(20))
    assert not protocol.held and not protocol.gate.held


async def test_the_queue_is_bounded_by_one_slice_of_small_requests(serve: Listener) -> None:
    """Small requests: a slice holds many; the queue passes the limit by at most one read's or slice's requests."""
    release, started = asyncio.Event(), []
    server = await serve(SniffingProtocol, environ=PIPELINE_ENV, service=held_service(release, started))
    reader, writer = await serve.connect(server)
    requests = [b"GET /api/v1/held/%d HTTP/1.1\r\nHost: t\r\n\r\n" % n for n in range(2000)]
    writer.write(b"".join(requests))
    protocol = await held_input(serve)
    one_read_or_slice = server_module.WHOLE_READ_BYTES // len(requests[0]) + 1
    assert 4 <= len(protocol.pipeline) <= 4 + one_read_or_slice
    release.set()
    bodies = await read_responses(reader, 2000)
    assert bodies == [b'{"n":%d}' % n for n in range(2000)]


async def test_a_large_body_is_parsed_in_few_pieces_and_the_request_behind_it_is_answered(
    serve: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 600 KB body of declared length is fed to the parser a read at a time, not a slice at a time; the
    pipelined GET after it in the same writes is parsed and answered after it."""
    release, started = asyncio.Event(), []
    release.set()
    parses: list[int] = []
    parse = server_module.BoundedHttpProtocol._parse

    def counting(self: server_module.BoundedHttpProtocol, data: bytes | memoryview) -> bool:
        parses.append(len(data))
        return parse(self, data)

    monkeypatch.setattr(server_module.BoundedHttpProtocol, "_parse", counting)
    server = await serve(SniffingProtocol, service=held_service(release, started))
    reader, writer = await serve.connect(server)
    body = b'{"data": "' + b"a" * 600_000 + b'"}'
    writer.write(
        b"POST /api/v1/size HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        % len(body)
        + body
        + b"GET /api/v1/held/7 HTTP/1.1\r\nHost: t\r\n\r\n"
    )
    assert await read_responses(reader, 2) == [b'{"size":600000}', b'{"n":7}']
    assert len(parses) < len(body) // server_module.PARSE_SLICE_BYTES // 4


async def test_a_chunked_body_over_several_slices_is_answered_with_the_request_behind_it(serve: Listener) -> None:
    release, started = asyncio.Event(), []
    release.set()
    server = await serve(SniffingProtocol, service=held_service(release, started))
    reader, writer = await serve.connect(server)
    body = b'{"data": "' + b"a" * 50_000 + b'"}'
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:30_000], body[30_000:])) + b"0\r\n\r\n"
    writer.write(
        b"POST /api/v1/size HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunks
        + b"GET /api/v1/held/3 HTTP/1.1\r\nHost: t\r\n\r\n"
    )
    assert await read_responses(reader, 2) == [b'{"size":50000}', b'{"n":3}']


async def test_an_address_over_max_connections_per_ip_is_answered_429_at_the_accept(serve: Listener) -> None:
    """127.0.0.2 holds its 2 connections: its third is answered at once, before it sends a byte; 127.0.0.1 is
    served; once 127.0.0.2 closes, its slots come back."""
    server = await serve(SniffingProtocol, environ={"SERVICE_MAX_CONNECTIONS_PER_IP": "2"})
    slots = serve.configs[-1].slots
    held = [await serve.connect(server, source="127.0.0.2") for _ in range(2)]
    await wait_until(lambda: slots.by_address.get("127.0.0.2") == 2)
    reader, _ = await serve.connect(server, source="127.0.0.2")
    assert await read_to_eof(reader) == TOO_MANY_FROM_ADDRESS
    assert slots.by_address == {"127.0.0.2": 2} and slots.total == 2
    reply = await exchange(port_of(server), b"GET /api/v1/x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    for _, writer in held:
        await close(writer)
    await wait_until(lambda: slots.total == 0)
    assert slots.by_address == {}
    reader, writer = await serve.connect(server, source="127.0.0.2")
    writer.write(b"GET /api/v1/x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    assert (await read_to_eof(reader)).startswith(b"HTTP/1.1 200 OK\r\n")


async def test_an_http11_connection_releases_its_slot_when_it_closes(serve: Listener) -> None:
    server = await serve(SniffingProtocol)
    slots = serve.configs[-1].slots
    reader, writer = await serve.connect(server)
    writer.write(b"GET /api/v1/x HTTP/1.1\r\nHost: t\r\n\r\n")
    await asyncio.wait_for(reader.readuntil(b'{"ok":true}'), timeout=10)
    (protocol,) = http11_connections(serve)
    assert slots.total == 1 and protocol.slot is not UNCOUNTED
    await close(writer)
    await wait_until(lambda: slots.total == 0)


def websocket_service() -> Service:
    service = Service("ws")

    async def live(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(await websocket.receive_text())

    service.version(1).websocket("/live")(live)
    return service


WEBSOCKET_HANDSHAKE = (
    b"GET /api/v1/live HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


async def test_a_websocket_holds_its_slot_until_it_closes(serve: Listener) -> None:
    """The upgrade hands the slot from the HTTP/1.1 protocol to the WebSocket one, which releases it when lost."""
    server = await serve(SniffingProtocol, service=websocket_service())
    slots = serve.configs[-1].slots
    reader, writer = await serve.connect(server)
    writer.write(WEBSOCKET_HANDSHAKE)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
    assert head.startswith(b"HTTP/1.1 101 ")
    (websocket,) = [p for p in serve.state.connections if isinstance(p, WebSocketProtocol)]
    assert websocket.slot is not UNCOUNTED
    assert slots.total == 1 and not http11_connections(serve)
    await close(writer)
    await wait_until(lambda: slots.total == 0)


async def test_an_http2_connection_takes_its_slot_to_the_h2_protocol(serve: Listener) -> None:
    """Handed over, the HTTP/2 protocol holds the slot (set before its connection_made) and releases it when lost;
    meanwhile it counts against max_connections like an HTTP/1.1 connection."""
    seen: list[Slot] = []

    class H2(asyncio.Protocol):
        slot: Slot = UNCOUNTED

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            seen.append(self.slot)

        def connection_lost(self, exc: Exception | None) -> None:
            self.slot.release()

    class WithH2(SniffingProtocol):
        h2_protocol_factory = H2

    server = await serve(WithH2, environ={"SERVICE_MAX_CONNECTIONS": "1"})
    slots = serve.configs[-1].slots
    _, writer = await serve.connect(server)
    writer.write(H2_PREFACE + SETTINGS_FRAME)
    await wait_until(lambda: bool(seen))
    assert seen[0] is not UNCOUNTED and slots.total == 1
    assert await exchange(port_of(server), b"GET /api/v1/x HTTP/1.1\r\nHost: t\r\n\r\n") == TOO_MANY_CONNECTIONS
    await close(writer)
    await wait_until(lambda: slots.total == 0)


async def test_a_connection_idle_after_a_held_pipeline_is_closed_after_keep_alive_timeout(serve: Listener) -> None:
    """The queue drains, the held input is parsed and answered; then the idle connection is closed by the
    keep-alive timeout like any other."""
    release, started = asyncio.Event(), []
    release.set()
    environ = {**PIPELINE_ENV, "SERVICE_KEEP_ALIVE_TIMEOUT_SECS": "1"}
    server = await serve(SniffingProtocol, environ=environ, service=held_service(release, started))
    reader, writer = await serve.connect(server)
    size = server_module.PARSE_SLICE_BYTES
    writer.write(b"".join(head_of_size(size, path=b"/api/v1/held/%d" % n) for n in range(20)))
    assert await read_responses(reader, 20) == [b'{"n":%d}' % n for n in range(20)]
    assert await read_to_eof(reader) == b""


def unread_body_service(release: asyncio.Event) -> Service:
    """``POST /api/v1/unread`` answers once ``release`` is set, without reading its body; ``GET /api/v1/x``."""
    service = Service("unread")

    async def unread() -> dict[str, bool]:
        await release.wait()
        return {"unread": True}

    v1 = service.version(1)
    v1.post("/unread")(unread)
    v1.get("/x")(lambda: {"ok": True})
    return service


async def test_a_request_after_a_large_body_the_app_never_read_is_answered(serve: Listener) -> None:
    """A body over uvicorn's high-water mark that the app answered without reading stays in the finished
    request; the next request on the connection is parsed and answered all the same (it waited forever once:
    the unread body held parsing as if the app were still reading it)."""
    release = asyncio.Event()
    server = await serve(
        SniffingProtocol, environ={"SERVICE_RATE_LIMIT_ENABLED": "false"}, service=unread_body_service(release)
    )
    reader, writer = await serve.connect(server)
    # One byte over the mark: reading pauses only once the last byte is parsed, so all of it is.
    body = b"a" * (HIGH_WATER_LIMIT + 1)
    writer.write(
        b"POST /api/v1/unread HTTP/1.1\r\nHost: t\r\nContent-Type: application/octet-stream\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    await wait_until(lambda: any(p.cycle is not None and not p.cycle.more_body for p in http11_connections(serve)))
    release.set()
    assert await read_responses(reader, 1) == [b'{"unread":true}']
    writer.write(b"GET /api/v1/x HTTP/1.1\r\nHost: t\r\n\r\n")
    assert await read_responses(reader, 1) == [b'{"ok":true}']


async def test_a_response_started_before_the_body_arrived_says_connection_close() -> None:
    """The head says ``connection: close``; uvicorn does not close the transport itself (the protocol half-closes
    it after the response, so body bytes still arriving cannot reset the response away)."""
    cycle, transport = coalescing_cycle("POST")
    cycle.more_body = True
    closed: list[int] = []
    transport.close = lambda: closed.append(len(transport.writes))  # type: ignore[attr-defined]
    await cycle.send(FIXED_START)
    await cycle.send({"type": "http.response.body", "body": b"{}"})
    assert transport.writes == [FIXED_HEAD.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n") + b"{}"]
    assert cycle.closes_early and cycle.keep_alive and closed == []


async def test_a_response_started_after_the_body_arrived_keeps_the_connection() -> None:
    cycle, transport = coalescing_cycle("POST")
    await cycle.send(FIXED_START)
    await cycle.send({"type": "http.response.body", "body": b"{}"})
    assert transport.writes == [FIXED_HEAD + b"{}"]
    assert not cycle.closes_early
