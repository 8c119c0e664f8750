"""Policy authorization in the HTTP pipeline (after token auth and rate limiting, before the handler)."""

from __future__ import annotations

from bastion.policy.authorizer import PolicyAuthorizer
from bastion.types import ASGIApp, Receive, Scope, Send


class PolicyMiddleware:
    """Ask the PolicyAuthorizer about each HTTP request and WebSocket handshake (a ``GET``).

    Reads scope[SCOPE_CLAIMS] (token auth) and scope[SCOPE_ROUTE] (route resolution). Raises PolicyDenied
    (403) or PolicyError (500); the error renderer shapes both.
    """

    def __init__(self, app: ASGIApp, *, authorizer: PolicyAuthorizer) -> None:
        self.app = app
        self.authorizer = authorizer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            await self.authorizer.authorize(scope)
        await self.app(scope, receive, send)
