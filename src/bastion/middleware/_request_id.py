"""Request ids: keep a sane incoming ``x-request-id``, else generate one; echo it and bind it to logs. And the one
place where response headers are added: the request id, the headers layers further in asked for (rate-limit
quota, deprecation; ``scope[SCOPE_RESPONSE_HEADERS]``) and the security headers, in one ``send`` wrapper."""

from __future__ import annotations

import os
import re

import structlog

from bastion.config import SecurityHeadersSettings
from bastion.middleware._security_headers import security_headers
from bastion.types import (
    RESPONSE_START,
    SCOPE_REQUEST_ID,
    SCOPE_RESPONSE_HEADERS,
    ASGIApp,
    Headers,
    Message,
    Receive,
    Scope,
    Send,
)

HEADER = b"x-request-id"
MAX_LENGTH = 128
# Printable token characters only: no spaces, quotes or control characters that could forge log lines.
_SANE = re.compile(rb"[A-Za-z0-9._:@/+=~-]{1,%d}" % MAX_LENGTH)


def sane_request_id(value: bytes) -> str | None:
    """``value`` when it is a sane token of 1-128 characters, else ``None`` (HTTP headers and gRPC metadata)."""
    return value.decode("ascii") if _SANE.fullmatch(value) else None


class _RandomPool:
    """Random bytes from the OS, fetched 4 KiB at a time: one ``getrandom`` system call per 256 ids instead of
    one per request (a system call is the dearest thing on this path). Emptied in a forked child, so that
    workers never hand out the same ids."""

    __slots__ = ("at", "pool")
    SIZE = 4096

    def __init__(self) -> None:
        self.pool = b""
        self.at = 0

    def reset(self) -> None:
        self.pool = b""
        self.at = 0

    def take16(self) -> bytes:
        at = self.at
        if at + 16 > len(self.pool):
            self.pool = os.urandom(self.SIZE)
            at = 0
        self.at = at + 16
        return self.pool[at : at + 16]


_random = _RandomPool()
os.register_at_fork(after_in_child=_random.reset)


def new_request_id() -> str:
    """A fresh id: 32 hex digits (128 bits from the OS's random source)."""
    return _random.take16().hex()


def incoming_request_id(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The client's ``x-request-id`` when it is sane, else ``None``."""
    for name, value in headers:
        if name == HEADER:
            return sane_request_id(value)
    return None


class RequestIdMiddleware:
    """Give every HTTP request an id, and every response its headers.

    Writes scope[SCOPE_REQUEST_ID], binds ``request_id`` into structlog's context for every log line of
    the request, and sets ``x-request-id`` on every response (replacing one the handler set).
    Outermost layer: everything inside, rejections included, carries the id.

    The same wrapper adds what layers further in put in ``scope[SCOPE_RESPONSE_HEADERS]`` (the rate-limit quota,
    the deprecation headers: they do not wrap ``send`` themselves) and, with ``security``, the security headers
    (nosniff, frame denial, referrer policy, optional CSP; HSTS only on requests that arrived over TLS, RFC 6797
    7.2), each unless the response already has it. One wrapper per request instead of one per layer.
    """

    def __init__(self, app: ASGIApp, *, security: SecurityHeadersSettings | None = None) -> None:
        self.app = app
        plain, tls = security_headers(security) if security is not None and security.enabled else ([], [])
        self.plain: Headers = plain
        self.secure: Headers = plain + tls

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        request_id = incoming_request_id(scope["headers"]) or new_request_id()
        scope[SCOPE_REQUEST_ID] = request_id
        raw = request_id.encode("ascii")
        start = RESPONSE_START[scope["type"]]

        protective = self.secure if scope.get("scheme") in ("https", "wss") else self.plain

        async def send_with_id(message: Message) -> None:
            if message["type"] == start:
                headers = []
                present = set()
                for item in message.get("headers", ()):
                    name = item[0].lower()
                    if name != HEADER:
                        headers.append(item)
                        present.add(name)
                asked = scope.get(SCOPE_RESPONSE_HEADERS)
                if asked:
                    headers.extend(asked)
                    present.update(name.lower() for name, _ in asked)
                for item in protective:
                    if item[0] not in present:
                        headers.append(item)
                headers.append((HEADER, raw))
                message["headers"] = headers
            await send(message)

        tokens = structlog.contextvars.bind_contextvars(request_id=request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            structlog.contextvars.reset_contextvars(**tokens)
