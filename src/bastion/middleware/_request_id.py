"""Request ids: keep a sane incoming ``x-request-id``, else generate one; echo it and bind it to logs. And the one
place where response headers are added: the request id, the headers layers further in asked for (rate-limit
quota, deprecation; ``scope[SCOPE_RESPONSE_HEADERS]``) and the security headers, in one ``send`` wrapper."""

from __future__ import annotations

import structlog

from bastion._request_ids import new_request_id, sane_request_id
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


def incoming_request_id(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The client's ``x-request-id`` when it is sane, else ``None``."""
    for name, value in headers:
        if name == HEADER:
            return sane_request_id(value)
    return None


def response_headers(message: Message, scope: Scope, protective: Headers, raw: bytes) -> Headers:
    """The headers of a response start: the handler's (its ``x-request-id`` dropped), what layers further in asked
    for (``scope[SCOPE_RESPONSE_HEADERS]``), the ``protective`` ones the response does not have and the id."""
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
    return headers


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

    def protective(self, scope: Scope) -> Headers:
        """The security headers for this request (HSTS only over TLS)."""
        return self.secure if scope.get("scheme") in ("https", "wss") else self.plain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        request_id = incoming_request_id(scope["headers"]) or new_request_id()
        scope[SCOPE_REQUEST_ID] = request_id
        raw = request_id.encode("ascii")
        start = RESPONSE_START[scope["type"]]

        protective = self.protective(scope)

        async def send_with_id(message: Message) -> None:
            if message["type"] == start:
                message["headers"] = response_headers(message, scope, protective, raw)
            await send(message)

        tokens = structlog.contextvars.bind_contextvars(request_id=request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            structlog.contextvars.reset_contextvars(**tokens)
