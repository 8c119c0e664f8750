"""Dispatch at the bottom of the stack: health > versioned > frontend > fallback > empty 404."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, request_response

from bastion._responses import send_response
from bastion.errors import MethodNotAllowed
from bastion.routing._resolve import RouteTable, route_path
from bastion.types import SCOPE_ROUTE, ASGIApp, Receive, Scope, Send

FallbackHandler = Callable[[Request], Awaitable[Response]]
_UNRESOLVED = object()


def handler_app(handler: FallbackHandler) -> ASGIApp:
    """An ASGI app from a ``request -> response`` handler (the fallback-handler form)."""
    return request_response(handler)


async def empty_not_found(scope: Scope, receive: Receive, send: Send) -> None:
    """The spec's unmatched-path answer: 404 with an empty body (also to a WebSocket handshake)."""
    websocket = scope["type"] == "websocket"
    if websocket and "websocket.http.response" not in (scope.get("extensions") or {}):
        await send({"type": "websocket.close", "code": 1008})  # the server refuses the handshake itself
        return
    await send_response(send, 404, [(b"content-length", b"0")], b"", websocket=websocket)


class Dispatcher:
    """Send each request to the first of: built-in (health/ready), versioned route, frontend route, fallback.

    Versioned routes were resolved by RouteResolutionMiddleware (scope[SCOPE_ROUTE]); a path that matches
    only with another method is a 405 in the error shape. Without a fallback an unmatched path is an empty 404.
    A WebSocket handshake reaches only WebSocket routes (versioned or frontend) or a fallback app; anywhere
    else (an HTTP route, ``/health``) it is refused with the same empty 404.
    """

    def __init__(
        self,
        *,
        builtins: Mapping[str, ASGIApp],
        table: RouteTable,
        versioned: ASGIApp,
        frontend: Sequence[BaseRoute] = (),
        fallback: ASGIApp | None = None,
        fallback_takes_websockets: bool = False,
    ) -> None:
        self.builtins = dict(builtins)
        self.table = table
        self.versioned = versioned
        self.frontend = list(frontend)
        self.fallback = fallback or empty_not_found
        # A fallback *app* (a proxy) may forward WebSockets; a request -> response handler cannot take one.
        self.websocket_fallback = self.fallback if fallback_takes_websockets else empty_not_found

    def reaches_nothing(self, scope: Scope) -> bool:
        """Whether this HTTP request or WebSocket handshake would get the empty 404: no built-in endpoint,
        versioned route (with any method), frontend route or fallback takes it."""
        websocket = scope["type"] == "websocket"
        if (self.websocket_fallback if websocket else self.fallback) is not empty_not_found:
            return False
        path = route_path(scope)
        if path in self.builtins and not websocket:
            return False
        resolved = scope.get(SCOPE_ROUTE, _UNRESOLVED)
        if resolved is _UNRESOLVED:
            resolved = self.table.resolve(scope.get("method", "GET"), path, websocket=websocket)
        if resolved is not None:
            return False
        return all(route.matches(scope)[0] is Match.NONE for route in self.frontend)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return
        path = route_path(scope)
        websocket = scope["type"] == "websocket"
        builtin = self.builtins.get(path)
        if builtin is not None and not websocket:
            if scope["method"] not in ("GET", "HEAD"):
                raise MethodNotAllowed(headers=[("allow", "GET, HEAD")])
            await builtin(scope, receive, send)
            return
        resolved = scope.get(SCOPE_ROUTE, _UNRESOLVED)
        if resolved is _UNRESOLVED:
            resolved = self.table.resolve(scope.get("method", "GET"), path, websocket=websocket)
        if resolved is not None:
            if not resolved.method_allowed:
                raise MethodNotAllowed(headers=[("allow", ", ".join(sorted(resolved.allowed_methods)))])
            handler = resolved.entry.handler
            if handler is None:
                await self.versioned(scope, receive, send)
                return
            scope["path_params"] = resolved.path_params
            await handler(scope, receive, send)
            return
        partial: BaseRoute | None = None
        for route in self.frontend:
            match, child_scope = route.matches(scope)
            if match is Match.FULL:
                scope.update(child_scope)
                await route.handle(scope, receive, send)
                return
            if match is Match.PARTIAL and partial is None:
                partial, partial_scope = route, child_scope
        if partial is not None:
            scope.update(partial_scope)
            await partial.handle(scope, receive, send)
            return
        await (self.websocket_fallback if websocket else self.fallback)(scope, receive, send)
