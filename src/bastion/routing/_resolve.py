"""Route resolution, once per request and before auth: which versioned route (template, path params) a path reaches."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter
from fastapi.routing import APIWebSocketRoute
from starlette.routing import WebSocketRoute, compile_path

from bastion._compat import fastapi as fastapi_compat
from bastion.routing._compiled import compile_route
from bastion.types import SCOPE_ROUTE, ASGIApp, Receive, Scope, Send

DOCS_ASSET_ROUTE = "api_docs_asset"
"""The name of the routes that serve the API docs' bundled scripts and styles (not an action policies name)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteEntry:
    """A route known before dispatch: its full path, methods and (for built-ins) its handler.

    ``path`` may carry convertors (``/items/{item_id:int}``); ``template`` is the same without them.
    """

    path: str
    methods: frozenset[str] | None
    version: int | None
    name: str | None = None
    handler: ASGIApp | None = None
    websocket: bool = False
    """A WebSocket route: matched only by WebSocket handshakes (which never match an HTTP route)."""
    public: bool = False
    """A framework route that needs no token and no policy decision: the API docs and OpenAPI documents with
    ``service.api_docs_public`` (never set for a business route)."""
    template: str = field(init=False)
    regex: re.Pattern[str] = field(init=False, repr=False)
    convertors: dict[str, Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        regex, template, convertors = compile_path(self.path)
        object.__setattr__(self, "template", template)
        object.__setattr__(self, "regex", regex)
        object.__setattr__(self, "convertors", convertors)


@dataclass(slots=True, kw_only=True)
class ResolvedRoute:
    """Where a request lands: ``"<METHOD> <template>"`` is its policy action; path params are resource attributes."""

    template: str
    path_params: dict[str, Any]
    version: int | None
    method_allowed: bool
    allowed_methods: frozenset[str]
    entry: RouteEntry


class RouteTable:
    """All versioned routes with full templates (``/api/v1/documents/{user_id}/{doc_id}``), in registration order."""

    def __init__(self, entries: Iterable[RouteEntry]) -> None:
        self.entries = list(entries)
        # Paths without parameters that no earlier route's pattern also matches: looked up in one step (the
        # first match is then necessarily theirs), every other path is matched in order.
        self.static: dict[str, list[RouteEntry]] = {}
        for position, entry in enumerate(self.entries):
            if entry.websocket or entry.convertors or entry.path in self.static:
                continue
            earlier = self.entries[:position]
            if any(not other.websocket and other.regex.match(entry.path) for other in earlier):
                continue
            same: list[RouteEntry] = []
            for other in self.entries[position:]:
                if other.websocket:
                    continue
                if not other.convertors and other.path == entry.path:
                    same.append(other)
                elif other.regex.match(entry.path):
                    break  # from here on another route could come first: those methods take the ordered scan
            self.static[entry.path] = same

    @classmethod
    def from_router(
        cls,
        router: APIRouter,
        *,
        version: int,
        compile_with: Collection[Callable[..., Any]] | None = None,
    ) -> list[RouteEntry]:
        """Entries for every route of ``router`` (flattening included routers), with their full templates.

        ``compile_with``: compile the routes whose shape allows it (``bastion.routing._compiled``), calling
        these dependencies inline; ``None`` keeps FastAPI's handler for every route.
        """
        entries: list[RouteEntry] = []
        for view in fastapi_compat.route_views(router.routes):
            if view.path is None:
                continue
            handler = view.handler
            if handler is not None and compile_with is not None:
                # Compiling reads the route's effective context; without one (older FastAPI) it is off: one
                # compiled_handlers_unavailable line (bastion.routing._compiled.available).
                handler = compile_route(view.context, handler, inline=compile_with) or handler
            entries.append(
                RouteEntry(
                    path=view.path,
                    methods=frozenset(view.methods) if view.methods else None,
                    version=version,
                    name=view.name,
                    handler=handler,
                    websocket=isinstance(view.original_route, APIWebSocketRoute | WebSocketRoute),
                )
            )
        return entries

    def resolve(self, method: str, path: str, *, websocket: bool = False) -> ResolvedRoute | None:
        """The route ``method path`` reaches; ``method_allowed`` is false when only other methods match.

        ``websocket`` resolves a WebSocket handshake: only WebSocket routes match it, and it matches no other.
        """
        if not websocket:
            for entry in self.static.get(path, ()):
                if entry.methods is None or method in entry.methods:
                    return _reached(entry, {})
        partial: tuple[RouteEntry, dict[str, Any]] | None = None
        allowed: set[str] = set()
        for entry in self.entries:
            if entry.websocket is not websocket:
                continue
            match = entry.regex.match(path)
            if match is None:
                continue
            params = {key: entry.convertors[key].convert(value) for key, value in match.groupdict().items()}
            if entry.methods is None or method in entry.methods:
                return _reached(entry, params)
            allowed |= entry.methods
            partial = partial or (entry, params)
        if partial is None:
            return None
        entry, params = partial
        return ResolvedRoute(
            template=entry.template,
            path_params=params,
            version=entry.version,
            method_allowed=False,
            allowed_methods=frozenset(allowed),
            entry=entry,
        )


def _reached(entry: RouteEntry, params: dict[str, Any]) -> ResolvedRoute:
    """``entry`` matched with the request's method."""
    return ResolvedRoute(
        template=entry.template,
        path_params=params,
        version=entry.version,
        method_allowed=True,
        allowed_methods=entry.methods or frozenset(),
        entry=entry,
    )


def route_path(scope: Scope) -> str:
    """The request path below the ASGI ``root_path`` (what routes match against)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


class RouteResolutionMiddleware:
    """Resolve the route once, before auth, rate limit and policy; write scope[SCOPE_ROUTE] (or ``None``)."""

    def __init__(self, app: ASGIApp, *, table: RouteTable) -> None:
        self.app = app
        self.table = table

    def enter(self, scope: Scope, receive: Receive) -> Receive:
        """The step for an HTTP request, as a plain call (``bastion._fused``)."""
        scope[SCOPE_ROUTE] = self.table.resolve(scope["method"], route_path(scope))
        return receive

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[SCOPE_ROUTE] = self.table.resolve(scope["method"], route_path(scope))
        elif scope["type"] == "websocket":
            scope[SCOPE_ROUTE] = self.table.resolve("GET", route_path(scope), websocket=True)
        await self.app(scope, receive, send)
