"""The listener's first-bytes sniffer: HTTP/1.1 to uvicorn, HTTP/2 preface to the h2 seam (gRPC), timeouts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from uvicorn.server import ServerState

from bastion import Service, load_settings
from bastion import server as server_module
from bastion.server import GOAWAY_PROTOCOL_ERROR, H2_PREFACE, SniffingProtocol, uvicorn_config

SETTINGS_FRAME = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"

Serve = Callable[[type[SniffingProtocol]], Awaitable[asyncio.Server]]


def app_service() -> Service:
    service = Service("sniff")
    service.version(1).get("/x")(lambda: {"ok": True})
    return service


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    settings = load_settings(environ={})
    config = uvicorn_config(app_service().build(settings), settings, host="127.0.0.1", port=0)
    config.load()
    state = ServerState()
    servers: list[asyncio.Server] = []

    async def start(protocol: type[SniffingProtocol]) -> asyncio.Server:
        server = await asyncio.get_running_loop().create_server(
            lambda: protocol(config=config, server_state=state, app_state={}), "127.0.0.1", 0
        )
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()
    for connection in list(state.connections):
        connection.shutdown()
    for server in servers:
        await server.wait_closed()


def port_of(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])


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


async def test_http11_goes_to_uvicorn(serve: Serve) -> None:
    server = await serve(SniffingProtocol)
    reply = await exchange(port_of(server), b"GET /api/v1/x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200")
    assert reply.endswith(b'{"ok":true}')


async def test_request_split_inside_the_sniffed_prefix(serve: Serve) -> None:
    """'P' could start POST or PRI: the sniffer waits for the next byte, then hands over everything."""
    server = await serve(SniffingProtocol)
    reply = await exchange(
        port_of(server), b"PUT /api/v1/x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", pause_after=1
    )
    assert reply.startswith(b"HTTP/1.1 405")


async def test_http2_preface_is_closed_without_grpc(serve: Serve) -> None:
    server = await serve(SniffingProtocol)
    assert await exchange(port_of(server), H2_PREFACE + SETTINGS_FRAME) == b""


async def test_http2_preface_goes_to_the_h2_factory(serve: Serve) -> None:
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


async def test_garbage_after_the_preface_gets_goaway_and_close(serve: Serve) -> None:
    class WithH2(SniffingProtocol):
        h2_protocol_factory = asyncio.Protocol

    server = await serve(WithH2)
    for garbage in (b"\xff" * 64, b"\x00\x00\x04\x01\x00\x00\x00\x00\x01abcd", b"garbage-garbage"):
        assert await exchange(port_of(server), H2_PREFACE + garbage) == GOAWAY_PROTOCOL_ERROR


async def test_half_sent_preface_then_silence_is_closed(serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "SNIFF_TIMEOUT_SECS", 0.2)
    server = await serve(SniffingProtocol)
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
    writer.write(H2_PREFACE[:10])
    await writer.drain()
    assert await asyncio.wait_for(reader.read(1024), timeout=10) == b""
    writer.close()
    await writer.wait_closed()
