"""Helpers for the in-process SMTP tests: a scripted envelope handler and a line-based client."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from mailrelay.smtp import _replies as r
from mailrelay.smtp._replies import Reply
from mailrelay.smtp._session import Envelope, Session


class ScriptedHandler:
    """Records envelopes; waits on `release` (when set) before answering, to simulate a slow webhook."""

    def __init__(self) -> None:
        self.envelopes: list[Envelope] = []
        self.release: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.finished = asyncio.Event()

    async def handle_envelope(self, envelope: Envelope, session: Session) -> Reply:
        self.started.set()
        if self.release is not None:
            await self.release.wait()
        self.envelopes.append(envelope)
        self.finished.set()
        return r.MESSAGE_ACCEPTED


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def line(self) -> bytes:
        return (await asyncio.wait_for(self.reader.readline(), 10)).rstrip(b"\r\n")

    async def reply(self) -> list[bytes]:
        lines = [await self.line()]
        while lines[-1][3:4] == b"-":
            lines.append(await self.line())
        return lines

    async def command(self, text: str) -> list[bytes]:
        self.writer.write(text.encode() + b"\r\n")
        await self.writer.drain()
        return await self.reply()

    async def at_eof(self) -> bool:
        return await asyncio.wait_for(self.reader.read(1), 10) == b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


Connect = Callable[[], Awaitable[Client]]
