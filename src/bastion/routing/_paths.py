"""Canonical request paths: one form that auth, rate limiting, policy and the router all see."""

from __future__ import annotations

import re

from bastion.errors import BadRequest
from bastion.types import ASGIApp, Receive, Scope, Send

_CONTROL = re.compile("[\x00-\x1f\x7f]")


def canonical_path(path: str) -> str:
    """Merge duplicate slashes and resolve ``.`` and ``..`` segments (RFC 3986 5.2.4), keeping a trailing slash.

    ``..`` above the root stays at the root. The path arrives percent-decoded once from the server; it is not
    decoded again (double decoding is how ``%252e%252e`` tricks work). Raises BadRequest for a path that is
    not absolute or contains control characters.
    """
    if not path.startswith("/") or _CONTROL.search(path) is not None:
        raise BadRequest("Invalid request path")
    if "//" not in path and "/." not in path:
        return path
    segments: list[str] = []
    parts = path.split("/")[1:]
    for index, segment in enumerate(parts):
        last = index == len(parts) - 1
        if segment == "..":
            if segments:
                segments.pop()
            if last:
                segments.append("")
        elif segment == ".":
            if last:
                segments.append("")
        elif segment or last:
            segments.append(segment)
    return "/" + "/".join(segments)


class PathNormalizationMiddleware:
    """Rewrite ``scope["path"]`` to its canonical form before any layer or route looks at it.

    ``//api/v1/x``, ``/api/v1/./x`` and ``/api/v1/../v1/x`` are all served and authorized as ``/api/v1/x``:
    no layer can see one path while the router dispatches another. ``raw_path`` is left as received.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope["path"] = canonical_path(scope["path"])
        await self.app(scope, receive, send)

    def enter(self, scope: Scope, receive: Receive) -> Receive:
        """The step for an HTTP request, as a plain call (``bastion._fused``)."""
        scope["path"] = canonical_path(scope["path"])
        return receive
