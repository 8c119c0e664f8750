"""Turning exceptions into the one JSON error shape: error rendering (inner) and panic recovery (outer)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from http import HTTPStatus

import structlog
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException, WebSocketException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.websockets import WebSocketDisconnect

from bastion._exception_handlers import ExceptionHandlers
from bastion._responses import send_response
from bastion.errors import (
    BadRequest,
    BastionError,
    GatewayTimeout,
    MalformedBody,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    PolicyDenied,
    RequestTimeout,
    TokenError,
    Unavailable,
    UnsupportedMediaType,
    ValidationFailed,
    render,
)
from bastion.types import ASGIApp, Message, Receive, Scope, Send
from bastion_core import BulkheadFullError, CircuitOpenError
from bastion_core._logging import exception_text

log = structlog.get_logger("bastion.errors")

_STARTED = frozenset({"http.response.start", "websocket.accept", "websocket.http.response.start", "websocket.close"})
_DENIAL_EXTENSION = "websocket.http.response"
# RFC 6455 7.4.1: 1011 = the server hit an unexpected condition.
WS_INTERNAL_ERROR = 1011


_CODE_FOR_STATUS: Mapping[int, type[BastionError]] = {
    cls.status: cls
    for cls in (
        BadRequest,
        TokenError,
        PolicyDenied,
        NotFound,
        MethodNotAllowed,
        PayloadTooLarge,
        UnsupportedMediaType,
        ValidationFailed,
        Unavailable,
        RequestTimeout,
        GatewayTimeout,
    )
}

_MAX_VALIDATION_ITEMS = 5
BODY_PARSE_ERROR = "There was an error parsing the body"
"""The detail of the 400 FastAPI raises when reading or decoding a body fails (the same on every supported FastAPI,
0.115 to 0.165)."""


def from_http_exception(exc: HTTPException) -> BastionError:
    """Translate a Starlette/FastAPI ``HTTPException`` raised by a handler into the error tree."""
    cls = _CODE_FOR_STATUS.get(exc.status_code)
    detail = exc.detail if isinstance(exc.detail, str) else None
    headers = list((exc.headers or {}).items())
    if cls is not None:
        return cls(detail, headers=headers) if cls is not Unavailable else Unavailable(detail)
    # An HTTPException with a status we do not model keeps its own status and a derived code.
    phrase = _phrase(exc.status_code)
    code = phrase.upper().replace(" ", "_").replace("-", "_").replace("'", "")
    unmodeled: type[BastionError] = type("HTTPError", (BastionError,), {"status": exc.status_code, "code": code})
    return unmodeled(detail or phrase, headers=headers)


def from_validation_error(exc: RequestValidationError) -> BastionError:
    """Translate FastAPI's request validation error: malformed JSON is 400, the rest 422."""
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return MalformedBody()
    parts = []
    for item in errors[:_MAX_VALIDATION_ITEMS]:
        loc = ".".join(str(p) for p in item.get("loc", ()))
        parts.append(f"{loc}: {item.get('msg', 'invalid')}")
    if len(errors) > _MAX_VALIDATION_ITEMS:
        parts.append(f"and {len(errors) - _MAX_VALIDATION_ITEMS} more")
    return ValidationFailed("Request validation failed: " + "; ".join(parts))


def as_bastion_error(exc: BaseException) -> BastionError | None:
    """The error-tree form of ``exc``, or ``None`` when it is an unexpected exception (a 500).

    An outbound guard's rejection raised inside a handler (a dependency's circuit is open, its bulkhead is
    full) is a 503 with ``Retry-After``: the service cannot answer for now, nothing is wrong with it.
    """
    if isinstance(exc, BastionError):
        return exc
    if isinstance(exc, CircuitOpenError | BulkheadFullError):
        return Unavailable(str(exc), retry_after=max(1, math.ceil(exc.retry_after)))
    if isinstance(exc, RequestValidationError):
        return from_validation_error(exc)
    if isinstance(exc, HTTPException):
        if exc.status_code == 400 and exc.detail == BODY_PARSE_ERROR:
            # FastAPI's (and the compiled handlers') wrapper of whatever reading and decoding the body raised: one
            # of ours (JsonTooDeep from the body limit) keeps its code; bytes that do not decode (not UTF-8/16/32,
            # a number of more than 4300 digits) are a malformed body.
            cause = exc.__cause__
            if isinstance(cause, BastionError):
                return cause
            if isinstance(cause, ValueError):
                return MalformedBody()
        return from_http_exception(exc)
    return None


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


async def send_error(send: Send, error: BastionError, scope: Scope) -> None:
    """Send ``error`` as a complete JSON response (the headers the request asked every response to carry,
    ``scope[SCOPE_RESPONSE_HEADERS]``, are added by the request-id step, as on any response).

    A WebSocket handshake gets the same HTTP response instead of ``101`` (ASGI's ``websocket.http.response``
    extension; a server without it refuses the handshake with its own 403).
    """
    status, headers, body = render(error)
    websocket = scope["type"] == "websocket"
    if websocket and _DENIAL_EXTENSION not in (scope.get("extensions") or {}):
        await send({"type": "websocket.close", "code": 1008})  # the server refuses the handshake itself
        return
    await send_response(send, status, headers, body, websocket=websocket)


class ResponseStarted:
    """Whether the response (or the WebSocket handshake answer) has started, and whether a WebSocket was
    accepted: after the start no error can be rendered. One per request (see :func:`response_started`)."""

    __slots__ = ("accepted", "started")

    def __init__(self) -> None:
        self.started = False
        self.accepted = False


class _TrackingSend:
    """``send`` that records the start of the response in the request's :class:`ResponseStarted`."""

    __slots__ = ("response", "send")

    def __init__(self, send: Send, response: ResponseStarted) -> None:
        self.send = send
        self.response = response

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind in _STARTED:
            self.response.started = True
            if kind == "websocket.accept":
                self.response.accepted = True
        await self.send(message)


RESPONSE_STARTED = "bastion.response_started"  # the request's ResponseStarted


def response_started(scope: Scope, send: Send) -> tuple[ResponseStarted, Send]:
    """The request's :class:`ResponseStarted`, and the ``send`` to pass inward.

    The outermost layer that asks (panic recovery, in the pipeline) puts the record in the scope and wraps its
    ``send`` to keep it; a layer further in (error rendering, the timeout) reads the same record and passes its
    ``send`` on unwrapped: one wrapper per request instead of one per layer. That holds because every message a
    layer further in sends reaches the wrapper: no step between them holds a response start back or starts one
    of its own while calling inward (compression, which holds the start back, sits inside all three). The scope
    holds the record, not the wrapper, so no reference cycle keeps a finished request's scope alive.
    """
    response: ResponseStarted | None = scope.get(RESPONSE_STARTED)
    if response is None:
        response = scope[RESPONSE_STARTED] = ResponseStarted()
        return response, _TrackingSend(send, response)
    return response, send


class ErrorRenderingMiddleware:
    """Render errors raised by the layers and handlers inside it as ``{"error","code","status"}``.

    Bastion errors, FastAPI validation errors and ``HTTPException`` keep their status; anything else is a
    500 logged with its traceback (and the request id bound by RequestIdMiddleware), never shown to the
    client. A WebSocket handshake refused before ``accept`` gets the same response; an error after
    ``accept`` closes the connection (1011, or a ``WebSocketException``'s own code). Sits inside the access
    log, CORS and security headers so rejections carry their headers.

    ``handlers``: the service's exception handlers (``@service.exception_handler``); an exception one of them
    handles is answered with what it returns (a BastionError rendered here, or its Response) instead.
    """

    def __init__(self, app: ASGIApp, *, handlers: ExceptionHandlers | None = None) -> None:
        self.app = app
        self.handlers = handlers if handlers else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        response, inward = response_started(scope, send)
        try:
            await self.app(scope, receive, inward)
        except ClientDisconnect:
            log.info("client_disconnected", path=scope["path"])
        except Exception as exc:
            handled = await self._handled(exc, scope)
            if isinstance(handled, Response):
                if not response.started:
                    await handled(scope, receive, send)
                return
            error = handled or _logged_error(exc, scope)
            if response.started:
                # Headers are on the wire: nothing to render; the server closes the broken response.
                log.warning("error_after_response_started", path=scope["path"], code=error.code)
                return
            await send_error(send, error, scope)

    async def _handled(self, exc: Exception, scope: Scope) -> BastionError | Response | None:
        """What the service's handler for ``exc`` answers (``None`` without one); a handler that fails is a 500."""
        if self.handlers is None:
            return None
        try:
            return await self.handlers.handle(exc, scope, rendered=as_bastion_error(exc) is not None)
        except Exception as failure:
            log.error(
                "exception_handler_failed",
                path=scope["path"],
                handled=type(exc).__name__,
                exception=exception_text(failure),
            )
            return BastionError()

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        response, inward = response_started(scope, send)
        try:
            await self.app(scope, receive, inward)
        except WebSocketDisconnect:
            log.info("client_disconnected", path=scope["path"])
        except WebSocketException as exc:
            if not response.started or response.accepted:
                with contextlib.suppress(Exception):  # the client may be gone already
                    await send({"type": "websocket.close", "code": exc.code, "reason": exc.reason or ""})
        except Exception as exc:
            error = _logged_error(exc, scope)
            if not response.started:
                await send_error(send, error, scope)
            elif response.accepted:
                with contextlib.suppress(Exception):
                    await send({"type": "websocket.close", "code": WS_INTERNAL_ERROR})


def _logged_error(exc: Exception, scope: Scope) -> BastionError:
    """``exc`` in the error tree; unexpected exceptions become a 500 logged with the traceback."""
    error = as_bastion_error(exc)
    if error is None:
        log.error(
            "unhandled_exception",
            path=scope["path"],
            method=scope.get("method", "GET"),
            exception=exception_text(exc),
        )
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
        response, inward = response_started(scope, send)
        try:
            await self.app(scope, receive, inward)
        except Exception as exc:
            await recover(exc, scope, response, send)


async def recover(exc: Exception, scope: Scope, response: ResponseStarted, send: Send) -> None:
    """Panic recovery's answer to ``exc``: logged, and a 500 in the error shape unless the response started."""
    log.error("panic_recovered", path=scope["path"], exception=exception_text(exc))
    if not response.started:
        await send_error(send, BastionError(), scope)
