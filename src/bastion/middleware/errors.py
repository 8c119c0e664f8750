"""Turning exceptions into the one JSON error shape: error rendering (inner) and panic recovery (outer)."""

from __future__ import annotations

import structlog
from starlette.requests import ClientDisconnect

from bastion.errors import BastionError, as_bastion_error, render
from bastion.types import SCOPE_RESPONSE_HEADERS, ASGIApp, Message, Receive, Scope, Send

log = structlog.get_logger("bastion.errors")


async def send_error(send: Send, error: BastionError, scope: Scope) -> None:
    """Send ``error`` as a complete JSON response, with the headers the request asked every response to carry."""
    status, headers, body = render(error, scope.get(SCOPE_RESPONSE_HEADERS, ()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class TrackedSend:
    """``send`` that remembers whether the response has started (after which no error can be rendered)."""

    __slots__ = ("send", "started")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self.send(message)


class ErrorRenderingMiddleware:
    """Render errors raised by the layers and handlers inside it as ``{"error","code","status"}``.

    Bastion errors, FastAPI validation errors and ``HTTPException`` keep their status; anything else is a
    500 logged with its traceback (and the request id bound by RequestIdMiddleware), never shown to the
    client. Sits inside the access log, CORS and security headers so rejections carry their headers.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tracked = TrackedSend(send)
        try:
            await self.app(scope, receive, tracked)
        except ClientDisconnect:
            log.info("client_disconnected", path=scope["path"])
        except Exception as exc:
            error = as_bastion_error(exc)
            if error is None:
                log.error("unhandled_exception", path=scope["path"], method=scope["method"], exc_info=exc)
                error = BastionError()
            elif error.status >= 500:
                log.error("request_failed", path=scope["path"], code=error.code, error=error.detail)
            if tracked.started:
                # Headers are on the wire: nothing to render; the server closes the broken response.
                log.warning("error_after_response_started", path=scope["path"], code=error.code)
                return
            await send_error(send, error, scope)


class PanicRecoveryMiddleware:
    """Last resort: a bug in an outer layer still becomes a logged 500 in the error shape."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tracked = TrackedSend(send)
        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            log.error("panic_recovered", path=scope["path"], exc_info=exc)
            if not tracked.started:
                await send_error(send, BastionError(), scope)
