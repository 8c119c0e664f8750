"""In-process SMTP server fixtures: a real SmtpServer on 127.0.0.1:0 with a scripted handler."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from mailrelay.smtp._server import SmtpServer
from mailrelay.smtp._session import SmtpOptions
from tests.mailrelay.smtp.support import Client, Connect, ScriptedHandler


@pytest.fixture
def handler() -> ScriptedHandler:
    return ScriptedHandler()


@pytest.fixture
async def make_server(
    handler: ScriptedHandler,
) -> AsyncIterator[Callable[..., Awaitable[tuple[SmtpServer, Connect]]]]:
    servers: list[SmtpServer] = []
    clients: list[Client] = []

    async def make(**options: object) -> tuple[SmtpServer, Connect]:
        tls_context = options.pop("tls_context", None)
        observer = options.pop("observer", None)
        settings: dict[str, object] = {"targets": frozenset({"inbox@example.test"}), "max_message_size": 10_000}
        settings.update(options)
        server = SmtpServer(
            options=SmtpOptions(**settings),  # type: ignore[arg-type]
            handler=handler,
            tls_context=tls_context,  # type: ignore[arg-type]
            observer=observer,  # type: ignore[arg-type]
        )
        await server.start("127.0.0.1", 0)
        servers.append(server)

        async def connect() -> Client:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            client = Client(reader, writer)
            clients.append(client)
            return client

        return server, connect

    yield make
    for client in clients:
        await client.close()
    for server in servers:
        await server.shutdown(grace=1.0)
