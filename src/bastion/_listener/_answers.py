"""The answers the listener writes itself, below the ASGI app, and how it closes after them."""

from __future__ import annotations

import asyncio
from http import HTTPStatus

from bastion.errors import BastionError, HeadersTooLarge, RateLimitExceeded, Unavailable, render

LINGER_SECS = 2.0


def raw_response(error: BastionError) -> bytes:
    """The complete HTTP/1.1 response for ``error`` in the error shape, with ``connection: close``.

    For answers the listener writes itself, below the ASGI app (so without the app's request id and security
    headers).
    """
    status, headers, body = render(error, [(b"connection", b"close")])
    status_line = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()
    return b"\r\n".join([status_line, *(name + b": " + value for name, value in headers), b"", body])


HEADERS_TOO_LARGE_RESPONSE = raw_response(HeadersTooLarge())
TOO_MANY_CONNECTIONS_RESPONSE = raw_response(Unavailable("Service unavailable: too many connections", retry_after=1))
TOO_MANY_FROM_ADDRESS_RESPONSE = raw_response(
    RateLimitExceeded("Too many connections from this address", retry_after=1)
)


def answer_and_close(
    transport: asyncio.Transport, response: bytes, loop: asyncio.AbstractEventLoop
) -> asyncio.TimerHandle | None:
    """Write a final response and close without letting a reset destroy it; returns the linger timer.

    A socket closed with unread input answers the peer with RST, and a client still sending (a long header,
    a body) may then lose the response before it reads it. So the response is followed by FIN, and the
    caller drops what still arrives until the client closes or ``LINGER_SECS`` pass. TLS cannot half-close:
    there the connection is closed at once.
    """
    transport.write(response)
    if not transport.can_write_eof():
        transport.close()
        return None
    transport.write_eof()
    return loop.call_later(LINGER_SECS, transport.close)
