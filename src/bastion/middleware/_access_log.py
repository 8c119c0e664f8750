"""Access log: one structured line per request, sensitive headers and query values masked."""

from __future__ import annotations

import time
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode

import structlog

from bastion.config import AccessLogSettings
from bastion.types import ASGIApp, Message, Receive, Scope, Send

MASK = "***"
SENSITIVE_QUERY_KEYS = frozenset({"access_token", "token", "api_key", "apikey", "password", "secret", "code"})

log = structlog.get_logger("bastion.access")


def mask_headers(headers: Iterable[tuple[bytes, bytes]], sensitive: frozenset[str]) -> dict[str, str]:
    """Request headers as a dict for logging, with the values of ``sensitive`` names replaced by ``***``."""
    masked: dict[str, str] = {}
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        value = MASK if name in sensitive else raw_value.decode("latin-1")
        masked[name] = f"{masked[name]}, {value}" if name in masked else value
    return masked


def mask_query(query: bytes) -> str:
    """The query string with the values of credential-like parameters replaced by ``***``."""
    if not query:
        return ""
    pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
    return urlencode([(k, MASK if k.lower() in SENSITIVE_QUERY_KEYS else v) for k, v in pairs])


class AccessLogMiddleware:
    """Log ``http_request`` with method, path, status, duration and client once the response is sent.

    A WebSocket session is logged when it ends, with ``websocket: true`` and the handshake's status (101
    when accepted).

    Headers are logged only with ``include_headers = true``, and then masked; bodies never are.
    """

    def __init__(self, app: ASGIApp, *, settings: AccessLogSettings) -> None:
        self.app = app
        self.include_headers = settings.include_headers
        self.sensitive = frozenset(h.lower() for h in settings.sensitive_headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http" and kind != "websocket":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 0

        async def send_and_record(message: Message) -> None:
            nonlocal status
            kind = message["type"]
            if kind == "http.response.start" or kind == "websocket.http.response.start":
                status = message["status"]
            elif kind == "websocket.accept":
                status = 101
            elif kind == "websocket.close" and not status:
                status = 403  # refused before accept: the server answers the handshake with 403
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            client = scope.get("client")
            fields: dict[str, object] = {
                "method": scope.get("method", "GET"),
                "path": scope["path"],
                "status": status,
                "duration_ms": round((time.perf_counter() - start) * 1000, 3),
                "client": client[0] if client else None,
            }
            if scope.get("query_string"):
                fields["query"] = mask_query(scope["query_string"])
            if self.include_headers:
                fields["headers"] = mask_headers(scope["headers"], self.sensitive)
            if kind == "websocket":
                fields["websocket"] = True
            log.info("http_request", **fields)
