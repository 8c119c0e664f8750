"""The pipeline compiled: adjacent built-in steps of an HTTP request run in one coroutine, with one ``send`` wrapper.

``bastion._pipeline.assemble`` builds every step's ASGI layer as before (each one once, in the order of the
pipeline's list) and then puts two kinds of fused layers over runs of adjacent steps:

- :class:`Edge`, over the outer steps request id, observe, panic recovery and CORS: one ``send`` wrapper per
  response does what their four did (the response's status for the metrics and the access log, whether the
  response started, ``Vary: Origin``, the request id, security headers and the headers later steps asked for).
- :class:`Checks`, over a run of *plain* steps (path normalization, body limit, compression, deprecation, route
  resolution: ``enter(scope, receive)`` is the whole step) followed by *guards* (token auth, rate limit, policy,
  resilience, an operator's guard): called one after the other, the guards' checks awaited in the same coroutine.

Both take only HTTP requests: a WebSocket handshake (or any other connection) goes through the same steps' own
layers, nested, as does a request for which a plain step has something to wrap (``enter`` returns ``None``: a
client that accepts gzip, the deprecation counter by caller): from that step on it runs nested. The answer, the
headers, the log lines and the outcomes the guards are told are the same either way (tests/bastion run the
pipeline fused; ``assemble(fuse=False)`` nests every step, ``bench/pipeline_micro.py`` compares the two).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import CoroutineType
from typing import Protocol, cast

import structlog
from starlette.requests import ClientDisconnect

from bastion._guard import Cleanup, GuardLayer, Outcome
from bastion._metrics import serve_metrics
from bastion._request_ids import new_request_id
from bastion.middleware._cors import vary_origin
from bastion.middleware._errors import RESPONSE_STARTED, ResponseStarted, as_bastion_error, recover
from bastion.middleware._limits import stalled_on_body
from bastion.middleware._observe import ObserveMiddleware
from bastion.middleware._request_id import RequestIdMiddleware, incoming_request_id, response_headers
from bastion.types import SCOPE_REQUEST_ID, ASGIApp, Headers, Message, Receive, Scope, Send


class Plain(Protocol):
    """A step that is a plain call for an HTTP request: it may read and write the scope, raise, and return the
    ``receive`` to pass on (its own, or one that measures the body); ``None`` when it has more to do for this request
    (its layer then runs, nested)."""

    def enter(self, scope: Scope, receive: Receive) -> Receive | None: ...

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None: ...


class Checks:
    """A run of plain steps then guards, for an HTTP request in one coroutine; ``app`` is what follows the run.

    ``first`` is the run's outermost layer (the steps nested): what other connections go through."""

    __slots__ = ("app", "first", "guards", "plains")

    def __init__(self, layers: Sequence[ASGIApp], app: ASGIApp) -> None:
        self.first = layers[0]
        self.plains: tuple[Plain, ...] = tuple(layer for layer in layers if not isinstance(layer, GuardLayer))  # type: ignore[misc]
        self.guards = tuple((layer.skips, layer.check) for layer in layers if isinstance(layer, GuardLayer))
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.first(scope, receive, send)
            return
        for plain in self.plains:
            entered = plain.enter(scope, receive)
            if entered is None:
                await plain(scope, receive, send)  # this step and the rest of the run, nested
                return
            receive = entered
        outcomes: list[Outcome] | None = None
        try:
            for skips, check in self.guards:
                if skips(scope):
                    continue
                result = check(scope)  # the outcome, or the coroutine that finishes the check
                outcome = cast("Outcome | None", await result if type(result) is CoroutineType else result)
                if outcome is not None:
                    if outcomes is None:
                        outcomes = [outcome]
                    else:
                        outcomes.append(outcome)
        except BaseException as exc:
            if outcomes is not None:
                await _report(outcomes, exc, scope)
            raise
        if outcomes is None:
            await self.app(scope, receive, send)
        else:
            await _reporting(outcomes, self.app, scope, receive, send)


async def _reporting(outcomes: list[Outcome], app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """Run ``app`` and tell each guard how the request ended, the last guard first (as nested layers would)."""
    if all(type(outcome) is Cleanup for outcome in outcomes):
        try:
            await app(scope, receive, send)
        finally:
            for outcome in reversed(outcomes):
                outcome.callback()  # type: ignore[attr-defined]
        return
    status = 0

    async def send_status(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    try:
        await app(scope, receive, send_status)
    except BaseException as exc:
        await _report(outcomes, exc, scope)
        raise
    for outcome in reversed(outcomes):
        if type(outcome) is Cleanup:
            outcome.callback()
        else:
            await outcome("OK" if status < 500 else "INTERNAL")


async def _report(outcomes: list[Outcome], exc: BaseException, scope: Scope) -> None:
    """What ``GuardLayer`` tells each outcome when the request ends with ``exc``, the last guard first."""
    if isinstance(exc, ClientDisconnect):
        status = None  # the client left before the answer: nothing learnt
    elif isinstance(exc, Exception):
        error = as_bastion_error(exc)
        status = "OK" if error is not None and error.status < 500 else "INTERNAL"
    elif isinstance(exc, asyncio.CancelledError):
        status = None if stalled_on_body(scope) else "DEADLINE_EXCEEDED"
    else:
        status = None
    for outcome in reversed(outcomes):
        if type(outcome) is Cleanup:
            outcome.callback()
        else:
            await outcome(status)


class _EdgeSend:
    """The one ``send`` wrapper of an HTTP request: what the request-id, observe, panic-recovery and CORS steps'
    wrappers did to a response start (``vary``: add ``Origin`` to ``Vary``, as CORS does for a request without
    ``Origin``)."""

    __slots__ = ("protective", "raw", "response", "scope", "send", "status", "vary")

    def __init__(self, send: Send, scope: Scope, response: ResponseStarted, protective: Headers, raw: bytes) -> None:
        self.send = send
        self.scope = scope
        self.response = response
        self.protective = protective
        self.raw = raw
        self.status = 0
        self.vary = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.response.started = True
            if self.vary:
                message["headers"] = vary_origin(list(message.get("headers", ())))
            message["headers"] = response_headers(message, self.scope, self.protective, self.raw)
        await self.send(message)


class Edge:
    """The request-id, observe (optional), panic-recovery and CORS (optional) steps, for an HTTP request in one
    coroutine with one ``send`` wrapper; ``app`` is what follows them, ``first`` the steps nested (other
    connections go through it)."""

    def __init__(
        self,
        first: ASGIApp,
        *,
        request_id: RequestIdMiddleware,
        observe: ObserveMiddleware | None,
        cors: ASGIApp | None,
        app: ASGIApp,
    ) -> None:
        self.first = first
        self.request_id = request_id
        self.observe = observe
        self.cors = cors
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.first(scope, receive, send)
            return
        request_id = incoming_request_id(scope["headers"]) or new_request_id()
        scope[SCOPE_REQUEST_ID] = request_id
        response: ResponseStarted | None = scope.get(RESPONSE_STARTED)
        if response is None:
            response = ResponseStarted()
        wrapper = _EdgeSend(send, scope, response, self.request_id.protective(scope), request_id.encode("ascii"))
        tokens = structlog.contextvars.bind_contextvars(request_id=request_id)
        try:
            observe = self.observe
            if observe is None:
                await self._recovering(scope, receive, wrapper, response)
            elif observe.serves_metrics(scope):
                await serve_metrics(observe.metrics, scope, receive, wrapper)  # type: ignore[arg-type]
            else:
                begun = observe.begin(scope)
                try:
                    await self._recovering(scope, receive, wrapper, response)
                finally:
                    observe.finish(scope, begun, wrapper.status)
        finally:
            structlog.contextvars.reset_contextvars(**tokens)

    async def _recovering(self, scope: Scope, receive: Receive, wrapper: _EdgeSend, response: ResponseStarted) -> None:
        scope[RESPONSE_STARTED] = response
        try:
            if self.cors is None:
                await self.app(scope, receive, wrapper)
            elif any(name == b"origin" for name, _ in scope["headers"]):
                await self.cors(scope, receive, wrapper)  # Starlette's CORS: preflights, cross-origin calls
            else:
                wrapper.vary = True
                await self.app(scope, receive, wrapper)
        except Exception as exc:
            wrapper.vary = False  # panic recovery's answer does not pass the CORS step
            await recover(exc, scope, response, wrapper)
