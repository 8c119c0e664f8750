"""The health endpoint: any method on /health -> 200 with an empty body, any other path -> 404 `Not Found`.

A deliberately tiny HTTP/1.1 responder on asyncio streams: one request per connection, no body
parsing beyond discarding what the client announced.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import urllib.parse

import structlog

HEALTH_PATH = "/health"
REQUEST_HEAD_LIMIT = 16 * 1024
READ_TIMEOUT_SECS = 10.0
MAX_DISCARDED_BODY = 64 * 1024
_ABSOLUTE_FORM = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

log = structlog.get_logger("mailrelay.health")


def response_for(method: str, target: str) -> bytes:
    """The full HTTP response for a request line's method and target (pure).

    The target may be in origin form (`/health?x`) or absolute form (`http://host/health`), which
    RFC 9112 3.2.2 says a server must accept.
    """
    if _ABSOLUTE_FORM.match(target):
        path = urllib.parse.urlsplit(target).path or "/"
    else:
        path = target.split("?", 1)[0].split("#", 1)[0]
    if path == HEALTH_PATH:
        status, body = "200 OK", b""
    else:
        status, body = "404 Not Found", b"Not Found"
    head = (
        f"HTTP/1.1 {status}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n\r\n"
    ).encode("ascii")
    return head if method == "HEAD" else head + body


BAD_REQUEST = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n\r\nBad Request"
)


class HealthServer:
    """Serves the health endpoint on its own port."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host=host, port=port, limit=REQUEST_HEAD_LIMIT)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(READ_TIMEOUT_SECS):
                response = await self._read_request(reader)
            writer.write(response)
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    @staticmethod
    async def _read_request(reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return BAD_REQUEST
        method, target = parts[0].upper(), parts[1]
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length" and value.strip().isdigit():
                length = int(value.strip())
        if 0 < length <= MAX_DISCARDED_BODY:
            await reader.readexactly(length)
        return response_for(method, target)
