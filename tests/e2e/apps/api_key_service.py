"""The example's API and gRPC service behind an operator's own auth layer (an API key), HTTP and gRPC alike.

Shows ``service.use(Slot.TOKEN_AUTH, layer, grpc=hook)``: the same check guards every HTTP request and every
gRPC call (tests/e2e/test_secure_by_default.py).
"""

from __future__ import annotations

from bastion import Service, Slot
from bastion.auth import Claims
from bastion.errors import TokenError
from bastion.types import SCOPE_CLAIMS, ASGIApp, Receive, Scope, Send
from examples.documents_api.api import register
from examples.documents_api.grpc_service import DocumentService
from examples.documents_api.store import seeded_store

API_KEY = b"letmein"


def check_api_key(scope: Scope) -> None:
    """Raise 401 / UNAUTHENTICATED unless the request carries ``x-api-key: letmein``; else claims for ``svc``."""
    if (b"x-api-key", API_KEY) not in scope["headers"]:
        raise TokenError("Missing or wrong API key")
    scope[SCOPE_CLAIMS] = Claims(sub="svc", roles=("service",), exp=2**62)


def api_key_layer(app: ASGIApp) -> ASGIApp:
    async def layer(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and scope["path"] not in ("/health", "/ready"):
            check_api_key(scope)
        await app(scope, receive, send)

    return layer


async def api_key_hook(scope: Scope) -> None:
    check_api_key(scope)


store = seeded_store()
service = Service("api-key-service", version="1.0.0")
register(service, store)
service.add_grpc_service(DocumentService(store))
service.use(Slot.TOKEN_AUTH, api_key_layer, grpc=api_key_hook)
