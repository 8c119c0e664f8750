"""Turning exceptions into the one JSON error shape: error rendering (inner) and panic recovery (outer)."""

from __future__ import annotations

import contextlib

import structlog
from starlette.exceptions import WebSocketException
from starlette.requests import ClientDisconnect
from starlette.websockets import WebSocketDisconnect

from bastion.errors import BastionError, as_bastion_error, render
from bastion.types import SCOPE_RESPONSE_HEADERS, ASGIApp, Message, Receive, Scope, Send

log = structlog.get_logger("bastion.errors")

_STARTED = frozenset({"http.response.start", "websocket.accept", "websocket.http.response.start", "websocket.close"})
_DENIAL_EXTENSION = "websocket.http.response"
# RFC 6455 7.4.1: 1011 = the server hit an unexpected condition.
WS_INTERNAL_ERROR = 1011


async def send_error(send: Send, error: BastionError, scope: Scope) -> None:
    """Send ``error`` as a complete JSON response, with the headers the request asked every response to carry.

    A WebSocket handshake gets the same HTTP response instead of ``101`` (ASGI's ``websocket.http.response``
    extension; a server without it refuses the handshake with its own 403).
    """
    status, headers, body = render(error, scope.get(SCOPE_RESPONSE_HEADERS, ()))
    if scope["type"] == "websocket":
        if _DENIAL_EXTENSION not in (scope.get("extensions") or {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class TrackedSend:
    """``send`` that remembers whether the response (or WebSocket handshake answer) has started.

    After that no error can be rendered.
    """

    __slots__ = ("accepted", "send", "started")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False
        self.accepted = False

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind in _STARTED:
            self.started = True
            self.accepted = self.accepted or kind == "websocket.accept"
        await self.send(message)


class ErrorRenderingMiddleware:
    """Render errors raised by the layers and handlers inside it as ``{"error","code","status"}``.

    Bastion errors, FastAPI validation errors and ``HTTPException`` keep their status; anything else is a
    500 logged with its traceback (and the request id bound by RequestIdMiddleware), never shown to the
    client. A WebSocket handshake refused before ``accept`` gets the same response; an error after
    ``accept`` closes the connection (1011, or a ``WebSocketException``'s own code). Sits inside the access
    log, CORS and security headers so rejections carry their headers.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tracked = TrackedSend(send)
        try:
            await self.app(scope, receive, tracked)
        except ClientDisconnect:
            log.info("client_disconnected", path=scope["path"])
        except Exception as exc:
            error = _logged_error(exc, scope)
            if tracked.started:
                # Headers are on the wire: nothing to render; the server closes the broken response.
                log.warning("error_after_response_started", path=scope["path"], code=error.code)
                return
            await send_error(send, error, scope)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        tracked = TrackedSend(send)
        try:
            await self.app(scope, receive, tracked)
        except WebSocketDisconnect:
            log.info("client_disconnected", path=scope["path"])
        except WebSocketException as exc:
            if not tracked.started or tracked.accepted:
                with contextlib.suppress(Exception):  # the client may be gone already
                    await send({"type": "websocket.close", "code": exc.code, "reason": exc.reason or ""})
        except Exception as exc:
            error = _logged_error(exc, scope)
            if not tracked.started:
                await send_error(send, error, scope)
            elif tracked.accepted:
                with contextlib.suppress(Exception):
                    await send({"type": "websocket.close", "code": WS_INTERNAL_ERROR})


def _logged_error(exc: Exception, scope: Scope) -> BastionError:
    """``exc`` in the error tree; unexpected exceptions become a 500 logged with the traceback."""
    error = as_bastion_error(exc)
    if error is None:
        log.error("unhandled_exception", path=scope["path"], method=scope.get("method", "GET"), exc_info=exc)
        return BastionError()
    if error.status >= 500:
        log.error("request_failed", path=scope["path"], code=error.code, error=error.detail)
    return error


class PanicRecoveryMiddleware:
    """Last resort: a bug in an outer layer still becomes a logged 500 in the error shape."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        tracked = TrackedSend(send)
        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            log.error("panic_recovered", path=scope["path"], exc_info=exc)
            if not tracked.started:
                await send_error(send, BastionError(), scope)
