"""The webhook's HTTP/1.1 client: keep-alive connections of its own, one POST at a time on each, through the breaker.

Why not aiohttp here: the relay POSTs one small JSON body per message to one URL, and aiohttp's general client (its
request and response objects, a writer task per request on Python 3.11, cookie and trace hooks) cost ~120 us of CPU
per POST against the bench's receiver, where this one costs ~20 us: the webhook was the larger half of the relay's
time per message. AiohttpTransport (`_transport.py`) stays for webhooks reached through a proxy
(HTTP_PROXY/HTTPS_PROXY), which this client does not speak.

Same contract as AiohttpTransport: `timeout` bounds the whole attempt (waiting for a connection, connecting, TLS,
sending, the answer's head, and draining a small body); the status line is the answer, a body that stalls or is
cut short afterwards does not turn a 2xx into a retry; 5xx, timeouts and connection errors count against the
breaker; redirects are not followed; bodies over STREAMED_BODY_BYTES are written in pieces as the socket takes them.
"""

from __future__ import annotations

import asyncio
import base64
import re
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import cast

from bastion_core import CircuitOpenError, Guard, running_loop
from mailrelay._delivery import TIMEOUT_PROBLEM, Attempt
from mailrelay._transport import (
    BODY_PIECE_BYTES,
    MAX_CONNECTIONS,
    MAX_DRAINED_RESPONSE_BYTES,
    STREAMED_BODY_BYTES,
    AiohttpTransport,
    env_proxy,
    tls_context,
)

MAX_RESPONSE_HEAD_BYTES = 64 * 1024  # a status line and headers longer than this are a broken answer
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?:[ \t][^\r\n]*)?")
_NO_BODY_STATUSES = frozenset({204, 304})
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"  # RFC 3986 pchar, "/" and "%" (an existing escape is kept)
# The problem names match AiohttpTransport's (its exception classes), so logs and metrics read the same.
CONNECT_ERROR = "connection error: ConnectError"
DISCONNECTED = "connection error: ServerDisconnectedError"
SOCKET_ERROR = "connection error: ClientOSError"
BAD_RESPONSE = "connection error: ClientResponseError"


def open_webhook_transport(*, url: str, guard: Guard, timeout: float) -> Http11Transport | AiohttpTransport:
    """The webhook's transport: this module's client, or aiohttp's when the environment names a proxy for `url`
    (call inside the running loop; close it with `close()`)."""
    if env_proxy(url) is not None:
        return AiohttpTransport.open(url=url, guard=guard, timeout=timeout)
    return Http11Transport(url=url, guard=guard, timeout=timeout)


def _basic_auth(user: str, password: str) -> str:
    credentials = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
    try:
        raw = credentials.encode("latin-1")
    except UnicodeEncodeError:
        raw = credentials.encode("utf-8")
    return "Basic " + base64.b64encode(raw).decode("ascii")


class _Failed(Exception):
    """An attempt that got no answer; `problem` is what the Attempt says."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


class _Connection(asyncio.Protocol):
    """One keep-alive connection: bytes in a buffer, a waiter woken by data, end of input, loss or the deadline."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.ended = False  # the server closed its side or the connection is gone: never reused
        self.timed_out = False
        self.paused = False
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; not an isinstance check: uvloop's transports are not asyncio.Transport subclasses.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._wake()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.paused = False
        self._wake()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake()

    def time_out(self) -> None:
        """The attempt's deadline passed: close, and wake whatever waits."""
        self.timed_out = True
        self.close()
        self._wake()

    def close(self) -> None:
        self.ended = True
        if self.transport is not None:
            self.transport.close()

    @property
    def reusable(self) -> bool:
        return not self.ended and self.transport is not None and not self.transport.is_closing()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Until something happens on the connection; TimeoutError once the deadline has passed."""
        if self.timed_out:
            raise TimeoutError
        self._waiter = running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self.timed_out:
            raise TimeoutError


class Http11Transport:
    """Implements WebhookTransport for an http:// or https:// `url` without a proxy (see the module's docstring).

    At most MAX_CONNECTIONS connections; an attempt that finds none free waits for one (within its timeout).
    A connection is reused when the answer had a Content-Length of at most MAX_DRAINED_RESPONSE_BYTES (read and
    dropped) or no body, and did not say `Connection: close`; otherwise it is closed after the answer.
    """

    def __init__(self, *, url: str, guard: Guard, timeout: float, tls: ssl.SSLContext | None = None) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("the webhook URL must be http:// or https:// with a host")
        self.url = url
        self.guard = guard
        self.timeout = timeout
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = (tls or tls_context()) if parts.scheme == "https" else None
        host = f"[{self.host}]" if ":" in self.host else self.host
        authority = host if parts.port is None else f"{host}:{parts.port}"
        # Percent-encoded as aiohttp (yarl) sends it: what is already valid stays as it is.
        target = urllib.parse.quote(parts.path or "/", safe=_PATH_SAFE)
        if parts.query:
            target += "?" + urllib.parse.quote(parts.query, safe=_PATH_SAFE + "?").replace("%20", "+")
        self._head_start = f"POST {target} HTTP/1.1\r\nHost: {authority}\r\nAccept: */*\r\n"
        if parts.username is not None or parts.password is not None:  # as aiohttp sends a URL's credentials
            self._head_start += f"Authorization: {_basic_auth(parts.username or '', parts.password or '')}\r\n"
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self._closed = False

    async def post(self, body: bytes, headers: Mapping[str, str]) -> Attempt:
        try:
            async with self.guard.call() as call:
                status, retry_after = await self._exchange(body, headers)
                if status >= 500:
                    call.fail()
        except CircuitOpenError:
            return Attempt(error="circuit open", circuit_open=True)
        except TimeoutError:
            return Attempt(error=TIMEOUT_PROBLEM)
        except _Failed as exc:
            return Attempt(error=exc.problem)
        return Attempt(status=status, retry_after=retry_after)

    async def _exchange(self, body: bytes, headers: Mapping[str, str]) -> tuple[int, str | None]:
        """One request and its answer's status and Retry-After, all within the timeout."""
        loop = running_loop()
        deadline = loop.time() + self.timeout
        if self._slots.locked():
            await asyncio.wait_for(self._slots.acquire(), self.timeout)  # TimeoutError: no slot was taken
        else:
            await self._slots.acquire()
        connection: _Connection | None = None
        timer: asyncio.TimerHandle | None = None
        try:
            connection = await self._take_connection(deadline)
            timer = loop.call_at(deadline, connection.time_out)
            await self._send(connection, body, headers)
            status, retry_after, reusable = await _read_answer(connection)
            if reusable and not self._closed:
                self._idle.append(connection)
                connection = None
            return status, retry_after
        finally:
            if timer is not None:
                timer.cancel()
            if connection is not None:
                connection.close()
            self._slots.release()

    async def _take_connection(self, deadline: float) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable and not connection.buffer:
                return connection
            connection.close()
        remaining = deadline - running_loop().time()
        try:
            _transport, connection = await asyncio.wait_for(
                running_loop().create_connection(
                    _Connection, self.host, self.port, ssl=self.tls, server_hostname=self.host if self.tls else None
                ),
                max(remaining, 0.0),
            )
        except TimeoutError:
            raise
        except OSError:
            raise _Failed(CONNECT_ERROR) from None
        return connection

    async def _send(self, connection: _Connection, body: bytes, headers: Mapping[str, str]) -> None:
        head = self._head_start + "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        head_bytes = f"{head}Content-Length: {len(body)}\r\n\r\n".encode("latin-1")
        transport = connection.transport
        assert transport is not None
        if len(body) <= STREAMED_BODY_BYTES:
            transport.write(head_bytes + body)
            return
        transport.write(head_bytes)
        view = memoryview(body)
        for start in range(0, len(view), BODY_PIECE_BYTES):
            while connection.paused and not connection.ended:
                await connection.wait()
            if connection.ended:
                raise TimeoutError if connection.timed_out else _Failed(SOCKET_ERROR)
            transport.write(view[start : start + BODY_PIECE_BYTES])

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


async def _read_answer(connection: _Connection) -> tuple[int, str | None, bool]:
    """The final answer's status and Retry-After (1xx interim answers skipped, as aiohttp does), and whether the
    connection can carry another request. A small body is read and dropped; trouble after the head leaves the
    answer as it is and only costs the connection."""
    while True:
        status, fields, minor = await _read_head(connection)
        if not 100 <= status < 200 or status == 101:
            break
    keep = minor == 1 and fields.get("connection", "").lower() != "close" and status != 101
    if status in _NO_BODY_STATUSES or status == 101:
        return status, fields.get("retry-after"), keep
    length = fields.get("content-length")
    if "transfer-encoding" in fields or length is None or not length.isdigit():
        return status, fields.get("retry-after"), False
    size = int(length)
    if size > MAX_DRAINED_RESPONSE_BYTES:
        return status, fields.get("retry-after"), False
    try:
        while len(connection.buffer) < size and not connection.ended:
            await connection.wait()
    except TimeoutError:
        return status, fields.get("retry-after"), False
    if len(connection.buffer) < size:
        return status, fields.get("retry-after"), False
    del connection.buffer[:size]
    return status, fields.get("retry-after"), keep and not connection.buffer


async def _read_head(connection: _Connection) -> tuple[int, dict[str, str], int]:
    """One response head: status, fields (lower-case names, first value wins), HTTP/1.x minor version."""
    while True:
        end = connection.buffer.find(b"\r\n\r\n")
        if end >= 0:
            break
        if len(connection.buffer) > MAX_RESPONSE_HEAD_BYTES:
            raise _Failed(BAD_RESPONSE)
        if connection.ended:
            if connection.timed_out:
                raise TimeoutError
            raise _Failed(DISCONNECTED)
        await connection.wait()
    head = bytes(connection.buffer[:end])
    del connection.buffer[: end + 4]
    status_line, _, rest = head.partition(b"\r\n")
    match = _STATUS_LINE.fullmatch(status_line)
    if match is None:
        raise _Failed(BAD_RESPONSE)
    fields: dict[str, str] = {}
    for line in rest.split(b"\r\n") if rest else ():
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise _Failed(BAD_RESPONSE)
        fields.setdefault(name.decode("latin-1").lower(), value.strip().decode("latin-1"))
    return int(match.group(2)), fields, int(match.group(1))
