"""A deliberately tiny HTTP/1.1 responder on asyncio streams for the operator's ports (health, metrics): one request
per connection, no body parsing beyond discarding what the client announced.

Whatever arrives gets an answer rather than a silent close: 400 for what is not an HTTP request (or names a target
that does not parse), 431 for a head over REQUEST_HEAD_LIMIT, 408 for a request that does not arrive in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence

REQUEST_HEAD_LIMIT = 16 * 1024
READ_TIMEOUT_SECS = 10.0
MAX_DISCARDED_BODY = 64 * 1024
# After answering a request whose rest was not read (a head or body too big): closing a socket with unread data
# resets the connection, and the client may lose the answer. So read and drop at most this much for this long.
LINGER_SECS = 2.0
LINGER_BYTES = 1024 * 1024
TEXT_PLAIN = "text/plain; charset=utf-8"
_ABSOLUTE_FORM = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

Responder = Callable[[str, str], Awaitable[bytes]]
"""(method in capitals, request path) -> the full HTTP response."""


def request_path(target: str) -> str | None:
    """The path of a request target in origin form (`/health?x`) or absolute form (`http://host/health`), which
    RFC 9112 3.2.2 says a server must accept; query and fragment dropped. None for an absolute form that does not
    parse (`http://[/health`: an unclosed IPv6 literal)."""
    if _ABSOLUTE_FORM.match(target):
        try:
            return urllib.parse.urlsplit(target).path or "/"
        except ValueError:
            return None
    return target.split("?", 1)[0].split("#", 1)[0]


def response(
    status: str,
    body: bytes,
    *,
    content_type: str = TEXT_PLAIN,
    head_only: bool = False,
    headers: Sequence[tuple[str, str]] = (),
) -> bytes:
    """A complete `Connection: close` response; `head_only` (a HEAD request) keeps the body's length, not the body."""
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers)
    head = (
        f"HTTP/1.1 {status}\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"{extra}"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n\r\n"
    ).encode("ascii")
    return head if head_only else head + body


BAD_REQUEST = response("400 Bad Request", b"Bad Request")
REQUEST_TIMEOUT = response("408 Request Timeout", b"Request Timeout")
HEAD_TOO_LARGE = response("431 Request Header Fields Too Large", b"Request Header Fields Too Large")


class HttpServer:
    """Answers each request on its own port with what `respond(method, path)` returns, then closes.

    `read_timeout` bounds the wait for the request's head and announced body (408 after it).
    """

    def __init__(self, respond: Responder, *, read_timeout: float = READ_TIMEOUT_SECS) -> None:
        self._respond = respond
        self.read_timeout = read_timeout
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
            answer, read_all = await self._answer(reader)
            if answer:
                writer.write(answer)
                await writer.drain()
                if not read_all:
                    await _linger(reader, writer)
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[bytes, bool]:
        """The response (empty for a client that left without sending anything) and whether the request was read
        to its end."""
        try:
            async with asyncio.timeout(self.read_timeout):
                request = await _read_request(reader)
        except TimeoutError:
            return REQUEST_TIMEOUT, True
        except asyncio.LimitOverrunError:
            return HEAD_TOO_LARGE, False
        except asyncio.IncompleteReadError as exc:  # the client stopped sending before the request's end
            return (BAD_REQUEST if exc.partial else b""), True
        if request is None:
            return BAD_REQUEST, True
        method, target, read_all = request
        path = request_path(target)
        if path is None:
            return BAD_REQUEST, read_all
        return await self._respond(method, path), read_all


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bool] | None:
    """The request line's method and target and whether the whole request was read (None when it is not HTTP);
    a body announced by Content-Length up to MAX_DISCARDED_BODY is read and dropped."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/") or not parts[0] or not parts[1]:
        return None
    length = 0
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip()
        if name == "content-length" and value.isdigit():
            length = int(value)
        elif name == "transfer-encoding":
            chunked = True
    read_all = not chunked and length <= MAX_DISCARDED_BODY
    if read_all and length:
        await reader.readexactly(length)
    return parts[0].upper(), parts[1], read_all


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After the answer: close our sending side, then read and drop what the client still sends (at most
    LINGER_BYTES, for at most LINGER_SECS), so that closing does not reset the connection under the answer."""
    with contextlib.suppress(OSError):  # the timeout, and a peer already gone (shutdown() can raise ENOTCONN)
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(LINGER_SECS):
            dropped = 0
            while dropped < LINGER_BYTES:
                chunk = await reader.read(64 * 1024)
                if not chunk:
                    return
                dropped += len(chunk)
