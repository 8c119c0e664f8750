"""uvicorn's request/response cycle, writing a fixed-length response's head and body in one ``write``."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle


class _Held:
    """A stand-in transport for ``http.response.start``: keeps the head uvicorn writes."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


class _Joined:
    """A stand-in transport for the first body message: its first write carries the held head."""

    __slots__ = ("head", "real")

    def __init__(self, real: asyncio.Transport, head: bytes) -> None:
        self.real = real
        self.head: bytes | None = head

    def write(self, data: bytes) -> None:
        if self.head is not None:
            data, self.head = self.head + data, None
        self.real.write(data)

    def close(self) -> None:
        self.real.close()

    def is_closing(self) -> bool:
        return self.real.is_closing()


class CoalescingCycle(RequestResponseCycle):
    """uvicorn's request/response cycle, writing a fixed-length response's head and body in one ``write``.

    uvicorn writes the status line and headers at ``http.response.start`` and the body at
    ``http.response.body``: two writes, and on an idle socket two ``send`` system calls per response. When the
    start declares a ``content-length`` (the body follows at once), its head is held and written together with
    the first body bytes, before anything that completing the response sets off (closing, the next pipelined
    response). A response without one (chunked, streaming: server-sent events) has its head written at start, as
    before, so a client sees it before the first chunk however late that is; so does the answer to ``HEAD``.
    """

    head: bytes | None = None
    closes_early = False
    """Whether the response started before the request's body had all arrived, and so says ``connection: close``."""

    async def send(self, message: Any) -> None:
        head = self.head
        if head is None:
            if (
                message["type"] == "http.response.start"
                and self.more_body
                and not self.closes_early
                and not self.response_started
            ):
                await self._start_closing(message)
                return
            if (
                message["type"] == "http.response.start"
                and not self.response_started
                and self.scope["method"] != "HEAD"
                and _declares_length(message)
            ):
                transport, held = self.transport, _Held()
                self.transport = held  # type: ignore[assignment]
                try:
                    await super().send(message)
                finally:
                    self.transport = transport
                self.head = held.data
                return
            await super().send(message)
            return
        self.head = None
        transport = self.transport
        joined = _Joined(transport, head)
        self.transport = joined  # type: ignore[assignment]
        try:
            await super().send(message)
        finally:
            self.transport = transport
            if joined.head and not self.disconnected:  # nothing was written (an invalid message): the head alone
                transport.write(joined.head)

    async def _start_closing(self, message: Any) -> None:
        """Start a response to a request whose body has not all arrived (a refusal that did not read it): the head
        says ``connection: close``, and the connection closes after it, half-closed by the protocol
        (``BoundedHttpProtocol.on_response_complete``) so that body bytes still arriving cannot reset the response
        away. uvicorn would close the transport at once when it sees the header: its ``keep_alive`` stays as it was.
        """
        keep_alive = self.keep_alive
        self.closes_early = True
        await self.send({**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]})
        self.keep_alive = keep_alive


def _declares_length(message: Any) -> bool:
    for name, _ in message.get("headers", ()):  # noqa: SIM110 (a loop: any() over a generator costs more here)
        if name == b"content-length":
            return True
    return False
